"""The Python API: from any input (flags, a file, a mapping) to an estimate.

::

    import megatron_estimator as me
    result = me.estimate(["--num-layers", "32", ...], world_size=8, budget="80GiB")
    result.fits, result.peak_stage.device_peak_bytes, result.stages, result.assumptions

Invalid input raises ``megatron_estimator.InvalidInput`` carrying every problem.  The CLI,
the pytest plugin and the planner are built on ``load_input`` and ``evaluate``.

This module is the front's one door to the layers below (DEVELOPERS.md, "Layout"): the CLI,
the settings and the pytest plugin import only it, ``report`` and ``core``.  What every front
needs resolved the same way lives here once: the budget (``budget_bytes``), the world size
(``world_size_for``), the overhead assumptions (``overheads_from_settings``), the GPU catalog
(``lookup_gpu``) and the launch itself (``exec_launch``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from megatron_estimator.core.argcheck import checked
from megatron_estimator.core.problems import InvalidInput, Problem, ProblemCollector
from megatron_estimator.config.world_size import world_size_for as _world_size_for
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.megatron.releases import DEFAULT_RELEASE, ChosenRelease
# The release a run is checked against (a ChosenRelease; the fronts pass it on as ``release=``),
# and the one of the Megatron-LM tree a launch script runs.
from megatron_estimator.inputs.release_choice import choose_megatron_release as _choose_release, launched_tree_release  # noqa: F401
from megatron_estimator.inputs.seed_options import SEED_WORLD_SIZE, SEED_WORLD_SOURCE, option_table as seed_options
from megatron_estimator.results.estimate import Assumption, Estimate, StageEstimate, Verdict
from megatron_estimator.core.sourced import Sourced
# One request, one way from input to verdict (request.py); suggest_changes re-estimates through it.
from megatron_estimator.request import Request, job_environ, suggest_changes as _suggest_changes, verdict_of as _verdict_of

__all__ = ["TrainingInput", "Assumption", "Estimate", "StageEstimate", "Verdict", "InvalidInput", "Problem", "estimate", "evaluate",
           "load_input", "input_from_flags", "input_from_model", "input_from_launch", "input_from_mapping",
           "input_from_file", "budget_bytes", "world_size_for", "overheads_from_settings", "lookup_gpu",
           "flash_attn_version", "not_a_training_input", "exec_launch", "suggest_changes", "Request", "verdict_of", "Sourced", "with_options",
           "seed_options"]

# The fronts' one world-size check and release choice, with their arguments checked here.
world_size_for = checked(_world_size_for, inp="megatron_estimator.api:TrainingInput | None")
choose_megatron_release = checked(_choose_release)
verdict_of = checked(_verdict_of)
suggest_changes = checked(_suggest_changes, inp="megatron_estimator.api:TrainingInput", refused=Estimate,
                          overheads="megatron_estimator.model.overhead:Overheads | None")


@dataclass(frozen=True)
class TrainingInput:
    """An input read into raw Megatron settings, with the world size it implies."""
    raw: RawArgs
    source: str
    world_size: int | None = None
    world_size_source: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)   # what the job's environment adds
    notes: tuple[str, ...] = ()
    job_environment: bool = False      # the environment is the launched job's (run, launch scripts)
    # A launch whose world size cannot be told: the problem to report unless the caller gives
    # one (a launch is never estimated on a guessed world).
    world_size_unknown: Problem | None = None
    launch_location: str | None = None  # file:line of a script's launch, where its environment applies
    entry: Any = None                   # inputs.entry_script.EntryScript: the launch's entry script, if any
    entry_dirs: tuple[str, ...] = ()    # where a relative entry script is looked for (a launch's)
    # The seed-style defaults this input took, in words (inputs/seed_options.py; with_options).
    defaults: tuple[str, ...] = ()
    # The Megatron-LM release it was read against (its flags); evaluate checks it against the same.
    release: ChosenRelease = DEFAULT_RELEASE


def _release(release: ChosenRelease | str | None) -> ChosenRelease:
    """A ``release=`` argument: a ``ChosenRelease``, a version (``"0.16"``), or None (main)."""
    if release is None or isinstance(release, ChosenRelease):
        return release or DEFAULT_RELEASE
    from megatron_estimator.megatron.releases import UnknownRelease, release_of

    try:
        return release_of(release, "release argument")
    except UnknownRelease as error:
        raise InvalidInput([Problem("unknown-megatron-version", "release", str(error))]) from None


def _mentions_yaml_cfg(argv: Sequence[str]) -> bool:
    """False only when no token can be ``--yaml-cfg`` or ``--yaml-cfg=...`` (one string search)."""
    try:
        return "--yaml-cfg" in "\0".join(argv)
    except TypeError:
        return True


@checked
def input_from_flags(argv: Sequence[str], *, environ: Mapping[str, str] | None = None,
                     locations: Sequence[str] | None = None, source: str = "command line",
                     entry_script: str | None = None, entry_location: str = "<command>",
                     entry_is_module: bool = False, entry_dirs: Sequence[str] = (),
                     accept_flags: Sequence[str] = (), opaque: Sequence[int] = (),
                     release: ChosenRelease | str | None = None) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """Megatron flags, honouring ``--yaml-cfg`` (Megatron then ignores the other flags).

    ``entry_script``: the script they follow (named at ``entry_location``; a relative path is
    looked for under ``entry_dirs``): its own flags are read from it when it is readable
    (inputs/entry_script.py ``read_entry_argv``).  ``accept_flags``: option strings accepted
    as the entry script's own (the ``accept-flags`` setting).  ``opaque``: the indexes of tokens
    not known statically (a launch script's, reported or noticed already; ``read_megatron_argv``).
    ``release``: the Megatron release whose flags they are (``_release``)."""
    from megatron_estimator.inputs.argv import read_megatron_argv

    release = _release(release)
    yaml_path = None
    if _mentions_yaml_cfg(argv) and any(token == "--yaml-cfg" or token.startswith("--yaml-cfg=") for token in argv):
        from megatron_estimator.inputs.megatron_yaml import yaml_cfg_path

        yaml_path = yaml_cfg_path(argv)
    if yaml_path is not None:
        from megatron_estimator.inputs.megatron_yaml import flags_ignored_by_yaml_cfg, load_megatron_yaml

        env = job_environ(environ, {})
        loaded = load_megatron_yaml(yaml_path, env)
        ignored = flags_ignored_by_yaml_cfg(argv)
        notes = ()
        if ignored:
            notes = (f"--yaml-cfg {yaml_path} replaces the command line: Megatron ignores "
                     + ", ".join(ignored),)
        entry = None
        if entry_script is not None:
            from megatron_estimator.inputs.entry_script import EntryScript

            entry = EntryScript(entry_script, entry_location, entry_is_module)
        return (TrainingInput(loaded.raw, source=f"{source} (--yaml-cfg {yaml_path})", notes=notes, entry=entry,
                              release=release),
                tuple(loaded.problems))
    locations = list(locations) if locations else None
    if entry_script is not None:
        from megatron_estimator.inputs.entry_script import read_entry_argv

        raw, problems, entry = read_entry_argv(list(argv), script=entry_script, script_location=entry_location,
                                               is_module=entry_is_module, base_dirs=entry_dirs,
                                               locations=locations, source=source, accepted=accept_flags,
                                               opaque=opaque, release=release.version,
                                               python_path=job_environ(environ, {}).get("PYTHONPATH") or "")
        return TrainingInput(raw, source=source, entry=entry, release=release, world_size=entry.world_size, notes=entry.assumptions,
                             world_size_source=entry.world_size_source), tuple(problems)
    reading = read_megatron_argv(list(argv), locations=locations, source=source, accepted=accept_flags,
                                 opaque=opaque, release=release.version)
    return TrainingInput(reading.raw, source=source, release=release), reading.problems


@checked
def input_from_model(flags: Sequence[str], *, hf_config: str | None = None, model: str | None = None,
                     environ: Mapping[str, str] | None = None, release: ChosenRelease | str | None = None
                     ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """A HuggingFace config.json (``--hf-config``: a local file or directory, an inline JSON
    object or a hub model id, ``inputs/hf/source.py``) or a named preset (``--model``) supplies the
    architecture; Megatron flags add to it or override it.  The notes show the flags the
    architecture maps to, so the user sees what was assumed."""
    release = _release(release)
    if hf_config is not None:
        from megatron_estimator.inputs.hf import load_hf_config
        from megatron_estimator.inputs.hf.source import INLINE

        imported = load_hf_config(hf_config, release.version)
        label = f"--hf-config {INLINE if imported.source == INLINE else hf_config}"
    else:
        from megatron_estimator.inputs.presets import load_preset

        if model is None:
            raise InvalidInput([Problem("missing-argument", "model", "give model= (a preset name) or hf_config=")])
        imported = load_preset(model, release.version)
        label = f"--model {model}"
    flag_input, flag_problems = input_from_flags(flags, environ=environ, release=release) if flags else (
        TrainingInput(RawArgs(), source="command line"), ())
    raw = imported.raw.merged(flag_input.raw) if flag_input.raw.settings else imported.raw
    if imported.problems or (flag_problems and not flag_input.raw.settings and "--yaml-cfg" in flag_input.source):
        # The architecture (or the --yaml-cfg that replaces the flags) could not be read: the
        # rest would only add follow-on problems (--num-layers is required, ...), so the
        # reading's own problems are the whole answer.
        raw = RawArgs({}, imported.source)
    overridden = sorted(set(imported.raw.settings) & set(flag_input.raw.settings))
    notes = [f"{label} supplies: {imported.command_line()}"] if imported.flags else []
    if overridden:
        notes.append("the command line overrides " + ", ".join("--" + d.replace("_", "-") for d in overridden))
    notes.extend(note.message for note in imported.notes)
    source = label if not flags else f"{label} + command line"
    return (TrainingInput(raw, source=source, notes=tuple(notes) + flag_input.notes, release=release),
            tuple(imported.problems) + tuple(flag_problems))


@checked
def with_options(inp: TrainingInput, problems: Sequence[Problem], options: Sequence[tuple[str, Any]], *,
                 flags: Sequence[str] = (), seed_style: bool = False, environ: Mapping[str, str] | None = None
                 ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """The seed tool's options (``(option, value)`` pairs such as ``("--tp", "2")``, a switch's
    value True) laid over ``inp`` as Megatron flags after ``--`` are, each located as its option;
    a ``conflicting-options`` problem for each that one of the Megatron flags ``flags`` sets
    otherwise.  ``seed_style`` (an estimate with no Megatron flags after ``--``): the seed's
    defaults fill what nothing gives, and the input's world size is the seed's 8 GPUs when it
    gives none (inputs/seed_options.py)."""
    from megatron_estimator.inputs.seed_options import conflicts, read_options, with_seed_defaults

    problems = tuple(problems)
    if problems and not inp.raw.settings:
        return inp, problems        # the input could not be read: its own problems are the answer
    raw, option_problems = read_options(options, inp.release.version)
    problems += option_problems
    if flags and raw.settings:
        given, _ = input_from_flags(list(flags), environ=environ, release=inp.release)
        problems += conflicts(raw, given.raw)
    merged = replace(inp.raw.merged(raw), source=inp.raw.source) if raw.settings else inp.raw
    defaults: tuple[str, ...] = ()
    if seed_style:
        merged, defaults = with_seed_defaults(merged)
        if inp.world_size is None:
            inp = replace(inp, world_size=SEED_WORLD_SIZE, world_size_source=SEED_WORLD_SOURCE)
    return replace(inp, raw=merged, defaults=inp.defaults + defaults), problems


@checked
def input_from_launch(argv: Sequence[str], *, environ: Mapping[str, str] | None = None,
                      accept_flags: Sequence[str] = (), release: ChosenRelease | str | None = None
                      ) -> tuple[TrainingInput, tuple[Problem, ...], Any]:
    """A launch command (torchrun ... pretrain_gpt.py --flags): (input, problems, LaunchCommand).
    The entry script is looked for relative to the working directory."""
    from megatron_estimator.inputs.entry_script import base_directories, entry_script_location
    from megatron_estimator.inputs.launch.command import unknown_world_size_problem
    from megatron_estimator.inputs.launch.walk import parse_launch_command

    env = dict(os.environ if environ is None else environ)
    command, problems = parse_launch_command(list(argv), env)
    if command.script is None:
        return TrainingInput(RawArgs(), source="launch command", release=_release(release)), tuple(problems), command
    inp, flag_problems = input_from_flags(command.megatron_argv, environ=job_environ(env, command.environment_dict),
                                          locations=command.megatron_locations, source=command.script,
                                          entry_script=command.script,
                                          entry_location=entry_script_location(command.locations, command.script_index,
                                                                               command.script),
                                          entry_is_module=command.script_is_module,
                                          entry_dirs=base_directories(env), accept_flags=accept_flags, release=release)
    own = inp.world_size_source is not None      # a framework's own world size (inputs/frameworks) wins
    inp = replace(inp, world_size=inp.world_size if own else command.world_size,
                  world_size_source=inp.world_size_source if own else command.world_size_source,
                  environment=_framework_environment(command.environment_dict, inp), job_environment=True,
                  world_size_unknown=None if own or command.world_size is not None else unknown_world_size_problem(command))
    return inp, tuple(problems) + flag_problems, command


def _framework_environment(launched: Mapping[str, str | None], inp: TrainingInput) -> dict:
    """The launch's environment with what its framework sets for the training processes
    (``EntryScript.environment``: verl's Ray runtime env), which wins."""
    own = dict(inp.entry.environment) if inp.entry is not None else {}
    return {**launched, **own} if own else dict(launched)


@checked
def input_from_mapping(settings: Mapping[str, Any], source: str = "mapping", release: ChosenRelease | str | None = None
                       ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """A mapping of Megatron dests (``num_layers``) or flags (``--num-layers``) to values."""
    from megatron_estimator.megatron.flags import closest_flags, flag_table

    release = _release(release)
    table = flag_table(release.version)
    problems = ProblemCollector()
    out: dict[str, RawSetting] = {}
    for key, value in settings.items():
        spec = table.by_option(key) if str(key).startswith("-") else table.by_dest(str(key))
        if spec is None:
            option = key if str(key).startswith("-") else "--" + str(key).replace("_", "-")
            hint = closest_flags(option, release=release.version)
            problems.add("unknown-flag", str(key), f"unknown Megatron setting {key!r}"
                         + (f"; did you mean {', '.join(hint)}?" if hint else ""))
            continue
        if spec.action == "store_false" and str(key).startswith("-") and isinstance(value, bool):
            value = not value  # '--no-x': True means the dest is False
        out[spec.dest] = RawSetting(spec.dest, value, f"{source}[{key!r}]")
    return TrainingInput(RawArgs(out, source=source), source=source, release=release), problems.problems


@checked
def input_from_file(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
                    script_args: Sequence[str] | None = None, world_size_given: bool = False,
                    accept_flags: Sequence[str] = (), release: ChosenRelease | str | None = None,
                    gpus_per_node: int | None = None) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """A seed-format YAML, a Megatron ``--yaml-cfg`` YAML, a launch script or a HF config.json.

    For a launch script: ``script_args`` are the arguments it runs with (None: not known), and
    ``world_size_given`` says the caller gives the world size (the launcher's need not resolve);
    its entry script is looked for relative to the working directory, then the script's own
    directory; ``gpus_per_node``: the GPUs of the node it runs on (what ``nvidia-smi -L | wc -l``
    in it prints; None: not known); ``accept_flags`` as for ``input_from_flags``."""
    from megatron_estimator.inputs.registry import ReadOptions, read_file

    from megatron_estimator.core.resources import path_string, path_trouble, shown_path

    name, release = shown_path(path), _release(release)
    trouble = path_trouble(path)
    if trouble is not None:     # empty, a NUL byte, not encodable, too long
        return TrainingInput(RawArgs(), source=name, release=release), (Problem("bad-path", name, trouble),)
    if not os.path.exists(path_string(path)):
        return TrainingInput(RawArgs(), source=name, release=release), (Problem("file-not-found", name, "no such file"),)
    env = dict(os.environ if environ is None else environ)
    loaded = read_file(path, ReadOptions(env, script_args=script_args, world_size_given=world_size_given,
                                         release=release.version, gpus_per_node=gpus_per_node))
    if loaded.flags is None:
        return (TrainingInput(loaded.raw, source=name, world_size=loaded.world_size,
                              world_size_source=loaded.world_size_source, environment=loaded.environment,
                              notes=loaded.notes, job_environment=loaded.job_environment,
                              world_size_unknown=loaded.world_size_unknown, launch_location=loaded.launch_location,
                              release=release), loaded.problems)
    # A launch: its Megatron flags are read as flags are, in the environment the job gets.
    from megatron_estimator.inputs.entry_script import base_directories

    # The directory the script's cd leaves first: a relative entry script is run from there.
    dirs = tuple(dict.fromkeys(((loaded.entry_cwd,) if loaded.entry_cwd else ()) + base_directories(env, name)))
    inp, flag_problems = input_from_flags(loaded.flags, environ=job_environ(env, loaded.environment),
                                          locations=loaded.flag_locations, source=name,
                                          entry_script=loaded.entry_script,
                                          entry_location=loaded.entry_location or loaded.launch_location or name,
                                          entry_is_module=loaded.entry_is_module,
                                          entry_dirs=dirs, accept_flags=accept_flags,
                                          opaque=tuple(loaded.opaque_flags), release=release)
    own = inp.world_size_source is not None      # a framework's own world size (inputs/frameworks) wins
    return (replace(inp, world_size=inp.world_size if own else loaded.world_size, entry_dirs=dirs,
                    world_size_source=inp.world_size_source if own else loaded.world_size_source,
                    notes=loaded.notes + inp.notes,
                    environment=_framework_environment(loaded.environment, inp), job_environment=loaded.job_environment,
                    world_size_unknown=None if own else loaded.world_size_unknown,
                    launch_location=loaded.launch_location), loaded.problems + flag_problems)


@checked
def input_from_log(path: str | os.PathLike, release: ChosenRelease | str | None = None
                   ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """A Megatron training log: the arguments block rank 0 printed (inputs/megatron_log.py)."""
    inp, problems, _ = _log_input(path, _release(release))
    return inp, problems


def _log_input(path, release: ChosenRelease) -> tuple[TrainingInput, tuple[Problem, ...], Any]:
    from megatron_estimator.inputs.megatron_log import read_megatron_log

    log = read_megatron_log(path, release.version)
    inp = TrainingInput(log.raw, source=str(path), world_size=log.world_size,
                        world_size_source=log.world_size_location, notes=log.notes, release=release)
    return inp, log.problems, log


@checked(overheads="megatron_estimator.model.overhead:Overheads | None")
def evaluate(inp: TrainingInput, *, world_size: int | None = None, world_size_source: str | None = None,
             budget: int | None = None, budget_source: str | None = None, overheads=None,
             environ: Mapping[str, str] | None = None, problems: Sequence[Problem] = (),
             suggest: bool = False, fits_on: bool = True) -> Verdict:
    """Validate and estimate one input: ``verdict_of`` a ``Request`` of these fields (request.py);
    never raises for bad input (the verdict holds the problems).  It is checked against the
    release it was read for (``inp.release``, named as ``Verdict.megatron``).

    With ``suggest``, a refusal (a stage over the budget) carries ``Verdict.suggestions``: the
    nearest changes that make every stage fit (``suggest_changes``); a fitting launch pays nothing.

    With ``fits_on`` (the default), ``Estimate.fits_on`` names the catalog GPUs on which every
    stage fits, each judged on its own run context (``results.catalog_fit``; worked out when first
    read); the planner's and the suggestions' re-estimates leave it out (None)."""
    return verdict_of(Request(
        inp, problems=tuple(problems),
        world_size=Sourced(world_size, world_size_source) if world_size is not None else None,
        budget=Sourced(budget, budget_source) if budget is not None or budget_source is not None else None,
        overheads=overheads, environ=environ, suggest=suggest, fits_on=fits_on))


@checked
def load_input(config: Any, *, environ: Mapping[str, str] | None = None, world_size_given: bool = False,
               release: ChosenRelease | str | None = None) -> tuple[TrainingInput, tuple[Problem, ...]]:
    if isinstance(config, (str, os.PathLike)) and not str(config).startswith("-"):
        return input_from_file(config, environ=environ, world_size_given=world_size_given, release=release)
    if isinstance(config, Mapping):
        return input_from_mapping(config, release=release)
    if isinstance(config, Sequence) and not isinstance(config, (str, bytes)):
        return input_from_flags([str(x) for x in config], environ=environ, release=release)
    raise InvalidInput([Problem("invalid-argument", "config", f"config must be a list of Megatron flags, a path or a mapping, not {type(config).__name__}")])


# world_size and budget: any value, checked with the configuration's problems (all at once)
@checked(world_size=Any, budget=Any, overheads="megatron_estimator.model.overhead:Overheads | None")
def estimate(config: Any, world_size: int | None = None, budget: int | str | None = None, *,
             environ: Mapping[str, str] | None = None, overheads=None,
             release: ChosenRelease | str | None = None) -> Estimate:
    """Estimate per-stage memory against ``release`` (a version such as ``"0.16"``, a
    ``ChosenRelease``, or None: main); raises InvalidInput with every problem found."""
    argument_problems: list[Problem] = []
    try:
        release = _release(release)
    except ValueError as err:
        argument_problems.append(Problem("unknown-megatron-release", "release", str(err)))
        release = DEFAULT_RELEASE
    given_budget = None
    try:
        if budget is not None:
            given_budget = Sourced(budget_bytes(budget), _budget_source(budget))
    except InvalidInput as err:
        argument_problems += err.problems
    inp, problems = load_input(config, environ=environ, world_size_given=world_size is not None, release=release)
    verdict = verdict_of(Request(inp, problems=tuple(argument_problems) + tuple(problems),
                                 world_size=Sourced(world_size, "world_size argument") if world_size is not None else None,
                                 world_size_location="world_size", budget=given_budget, overheads=overheads,
                                 environ=environ))
    if verdict.estimate is None:
        raise InvalidInput(verdict.problems)
    return verdict.estimate


# ---------------------------------------------------------------------------------------
# What every front resolves once, the same way: the budget, the world size, the overheads.

@checked
def budget_bytes(value: Any, location: str = "budget") -> int:
    """A budget as bytes: an int, or a size (``"80GiB"``, ``"80GB"``, ``"81920MiB"``);
    InvalidInput (``invalid-budget`` at ``location``) when it is neither or not positive.
    The API's ``budget=``, the pytest plugin's sources and the planner all read budgets here;
    the settings (``settings.py``) read theirs as a byte-size setting with the same units."""
    location = location.strip() or "budget"     # a problem is never unlocated
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise InvalidInput([Problem("invalid-budget", location, f"budget {value} bytes must be positive")])
        return value
    from megatron_estimator.core.units import parse_bytes

    if isinstance(value, bool) or not isinstance(value, (str, float)):
        raise InvalidInput([Problem("invalid-budget", location,
                                    f"budget must be bytes (an int) or a size such as '80GiB', not {value!r}")])
    size = parse_bytes(str(value), location=location)
    if size <= 0:
        raise InvalidInput([Problem("invalid-budget", location, f"budget {value!r} must be more than 0 bytes")])
    return size


def _budget_source(budget: int | str) -> str:
    """How a report names a budget given as an argument: ``80 bytes`` or ``budget 80GiB``."""
    return f"{budget} bytes" if isinstance(budget, int) else f"budget {budget}"


def driver_gpu_budget(environ: Mapping[str, str], proc_root: str | None = None):
    """``run`` with no budget from any source: (budget bytes, GpuSpec or None, source) for this
    machine's GPU as the NVIDIA driver names it (``inputs/driver_gpu.py``), or None when there is
    no driver.  A GPU of the catalog gives its capacity; another gives nvidia-smi's memory.total."""
    from megatron_estimator.inputs.driver_gpu import PROC_GPUS, detect_driver_gpu
    from megatron_estimator.megatron.gpus import find_gpu

    found = detect_driver_gpu(environ, PROC_GPUS if proc_root is None else proc_root)
    if found is None:
        return None
    spec = find_gpu(found.name)
    if spec is not None:
        return spec.total_memory_bytes, spec, f"{spec.name} capacity ({spec.memory_figure}; gpu from {found.source})"
    if found.memory_mib is not None:
        return found.memory_mib * 1024 * 1024, None, f"memory.total from {found.source} (not a GPU of the catalog)"
    return None


def job_stack(environ: Mapping[str, str], overheads: Any, settings: Any = None, path: Sequence[str] | None = None):
    """``run``: ``(overheads with the job's flash-attn and Transformer Engine, StackPackage
    records)`` from the job's package metadata on ``path`` (default: ``$PYTHONPATH`` of the
    launch's ``environ``, then ``sys.path``); the ``flash-attn`` setting, when given, wins."""
    from megatron_estimator.core.distributions import job_path
    from megatron_estimator.inputs.job_stack import detect_job_stack, with_stack

    return with_stack(overheads, detect_job_stack(job_path(environ) if path is None else list(path)), settings)


def stated_stack(settings: Any, overheads: Any):
    """``estimate`` / ``check``: the same, from the ``stack`` setting's stated versions."""
    from megatron_estimator.inputs.job_stack import stated_found, with_stack

    entry = settings.entry("stack")
    return with_stack(overheads, stated_found(entry.value), settings, entry.source) if entry.given else (overheads, ())


def overheads_from_settings(settings: Any, gpu: Any = None):
    """The overhead assumptions (``model.overhead.Overheads``) that ``settings`` (a
    ``settings.Settings``) give, for ``gpu`` (a ``GpuSpec``; default: the settings' GPU)."""
    from megatron_estimator.model.overhead import Overheads

    gpu = settings.gpu if gpu is None else gpu
    return Overheads(
        cuda_context_bytes=settings.cuda_context,
        nccl_bytes_per_communicator=settings.nccl_buffers,
        fragmentation=settings.fragmentation,
        routing_imbalance=settings.routing_imbalance,
        flash_attn=settings.flash_attn,
        resume=settings.resume,
        compute_capability=gpu.compute_capability_value if gpu is not None else 9.0,
        gpu_known=gpu is not None,
    )


@checked
def lookup_gpu(name: str, location: str = "--gpu"):
    """The GPU catalog's entry (``megatron.gpus.GpuSpec``) for ``name``; InvalidInput
    (``unknown-gpu`` / ``ambiguous-gpu``) naming ``location``."""
    from megatron_estimator.megatron.gpus import lookup_gpu as catalog_lookup

    return catalog_lookup(name, location=location.strip() or "--gpu")     # a problem is never unlocated


@checked
def flash_attn_version(text: str) -> tuple[int, ...] | None:
    """``2.7.4.post1`` -> ``(2, 7, 4)``: a flash-attn version as the estimator compares them."""
    from megatron_estimator.core.versions import version_tuple

    return version_tuple(text)


@checked(path=str | os.PathLike)
def not_a_training_input(path: str) -> str | None:
    """Why ``check --skip-unknown`` passes over this file, or None to check it (the reader of
    its kind says; a missing or unreadable file is checked and reported, never passed over)."""
    from megatron_estimator.inputs.registry import skip_reason

    return skip_reason(path)


def exec_launch(command: Any) -> None:
    """Replace this process with the launch command (``inputs.launch.command.LaunchCommand``):
    the same argv, the same environment.  Returns only by raising OSError."""
    from megatron_estimator.inputs.launch.execute import exec_launch as replace_process

    replace_process(command)


# -------------------------------------------------------------------------------------------
# The planner, wired to the inputs and the normal path


@checked
def plan_input(model: Any = None, *, extra_flags: Sequence[str] = (), preset: str | None = None,
               hf_config: str | None = None, environ: Mapping[str, str] | None = None,
               release: ChosenRelease | str | None = None) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """The model as a ``TrainingInput`` (read against ``release``; a ``TrainingInput`` keeps its own): Megatron flags, a mapping, a file (seed or Megatron
    YAML, launch script, HF config.json), a ``TrainingInput``, or a preset (``preset=``, or
    ``model`` a string that is no existing path, path separator or file suffix: ``deepseek-v3``)
    or a HF config (``hf_config=``).  ``extra_flags`` (Megatron flags) add to it or override
    it: a preset or a HF config gives the architecture, the flags the training settings
    (``input_from_model``)."""
    if (preset is None and hf_config is None and isinstance(model, str) and not model.startswith("-")
            and not os.path.exists(model) and os.sep not in model
            and not model.endswith((".json", ".yaml", ".yml", ".sh", ".toml"))):
        preset = model
    if preset is not None or hf_config is not None:
        return input_from_model(list(extra_flags), hf_config=hf_config, model=preset, environ=environ,
                                release=release)
    if model is None:
        return input_from_flags(list(extra_flags), environ=environ, release=release)
    if isinstance(model, TrainingInput):
        inp, problems = model, ()
    else:
        inp, problems = load_input(model, environ=environ, release=release)
    if extra_flags:
        flag_input, flag_problems = input_from_flags(list(extra_flags), environ=environ, release=inp.release)
        inp = replace(inp, raw=inp.raw.merged(flag_input.raw), source=f"{inp.source} + command line")
        problems = tuple(problems) + tuple(flag_problems)
    return inp, tuple(problems)


@checked(overheads="megatron_estimator.model.overhead:Overheads | None", space="megatron_estimator.results.plan:SearchSpace | None", progress=Callable | None, clock=Callable | None)
def plan(model: Any = None, *, world_size: int, global_batch_size: int, budget: int | str | None = None,
         budget_source: str | None = None, gpu: str | None = None, extra_flags: Sequence[str] = (),
         preset: str | None = None, hf_config: str | None = None, top: int | None = 10,
         space=None, proxy=None, overheads=None, environ: Mapping[str, str] | None = None, verify: bool = True,
         progress=None, clock=None, release: ChosenRelease | str | None = None):
    """Every layout of the model (``plan_input``) on ``world_size`` GPUs that Megatron accepts
    and that fits the budget (bytes, a size such as ``"80GiB"``, or the capacity of ``gpu``),
    ranked by the throughput proxy (``planner.search``): a ``results.plan.Plan``.  The best
    ``top`` (all with None) become candidates; with ``verify`` each is re-estimated through
    ``evaluate`` (its ``estimate``), and its figures must agree.  Raises InvalidInput with
    every problem of the input; a plan where nothing fits has ``fitting == 0``.
    ``progress``: a callable given a ``results.plan.SearchProgress`` when the search runs past
    a second (by ``clock``, default ``time.perf_counter``), then about once a second; the
    planner itself never prints."""
    import time

    from megatron_estimator.model.overhead import Overheads
    from megatron_estimator.planner.search import search
    from megatron_estimator.results.plan import ProxyAssumptions, SearchSpace

    clock = clock or time.perf_counter
    started = clock()
    problems: list[Problem] = []
    problems += world_size_for(None, world_size, "--world-size")[1]
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool) or global_batch_size < 1:
        problems.append(Problem("out-of-range", "--global-batch-size",
                                f"global batch size {global_batch_size!r} must be a positive integer"))
    gpu_spec = None
    if gpu is not None:
        try:
            gpu_spec = lookup_gpu(gpu)
        except InvalidInput as err:
            problems += err.problems
    budget_size = None
    if budget is not None:
        try:
            budget_size = budget_bytes(budget)
            budget_source = budget_source or _budget_source(budget)
        except InvalidInput as err:
            problems += err.problems
    elif gpu_spec is not None:
        budget_size, budget_source = gpu_spec.total_memory_bytes, budget_source or f"{gpu_spec.name} capacity"
    elif gpu is None:
        problems.append(Problem("missing-budget", "--budget", "the planner needs a budget: --budget SIZE or --gpu NAME"))
    inp, input_problems = plan_input(model, extra_flags=extra_flags, preset=preset, hf_config=hf_config,
                                     environ=environ, release=release)
    problems += input_problems
    from megatron_estimator.config.family import family_refusal

    problems += family_refusal(inp.raw, inp.entry)
    if problems:
        raise InvalidInput(problems)
    if overheads is None:
        overheads = Overheads(compute_capability=gpu_spec.compute_capability_value if gpu_spec else 9.0,
                              gpu_known=gpu_spec is not None)
    # Layouts are planned for a fresh start: a resumed run's checkpoint exchange buffers
    # (model/checkpoint.py) depend on the checkpoint on disk, not on the layout searched.
    overheads = replace(overheads, resume="no")
    env = job_environ(environ, inp.environment)

    def verifier(raw: RawArgs) -> Verdict:
        return verdict_of(Request(replace(inp, raw=raw), world_size=Sourced(world_size, "--world-size"),
                                  budget=Sourced(budget_size, budget_source), overheads=overheads, environ=env,
                                  fits_on=False))

    return search(inp, world_size=world_size, global_batch_size=global_batch_size, budget=budget_size,
                  budget_source=budget_source, overheads=overheads, environ=env, space=space or SearchSpace(),
                  proxy=proxy or ProxyAssumptions(), top=top, verify=verifier if verify else None, started=started,
                  progress=progress, clock=clock)


def search_space(**bounds):
    """The planner's ``results.plan.SearchSpace`` with these bounds (the defaults elsewhere)."""
    from megatron_estimator.results.plan import SearchSpace

    return SearchSpace(**bounds)


@checked(space="megatron_estimator.results.plan:SearchSpace | None")
def planned_layouts(model: Any, *, world_size: int, global_batch_size: int, extra_flags: Sequence[str] = (),
                    space=None, environ: Mapping[str, str] | None = None, release: ChosenRelease | str | None = None):
    """Every layout ``plan`` searches, as the planned settings (dest -> value) of each
    (``planner.search.layouts``)."""
    from megatron_estimator.config.family import family_refusal
    from megatron_estimator.planner.search import layouts

    inp, problems = plan_input(model, extra_flags=extra_flags, environ=environ, release=release)
    problems = tuple(problems) + family_refusal(inp.raw, inp.entry)
    if problems:
        raise InvalidInput(problems)
    return layouts(inp, world_size=world_size, global_batch_size=global_batch_size,
                   environ=job_environ(environ, inp.environment), space=space)


@checked(overheads="megatron_estimator.model.overhead:Overheads | None")
def compare_log(path: str | os.PathLike, *, world_size: int | None = None, budget: int | None = None,
                budget_source: str | None = None, overheads=None, environ: Mapping[str, str] | None = None,
                suggest_settings: bool = False, release: ChosenRelease | str | None = None):
    """A Megatron training log against the estimate of the configuration it logged.

    The configuration is rebuilt from the log's arguments block and estimated through
    ``evaluate``; each rank's ``report_memory`` peaks are set beside its pipeline stage's
    estimate, and each CUDA out-of-memory message beside the verdict.  Without a budget, a log
    that ran out of memory is judged against the GPU's total capacity its message names.
    Returns ``results.comparison.LogComparison``; never raises for bad input."""
    from megatron_estimator.model.overhead import Overheads, communicators
    from megatron_estimator.results import comparison

    from megatron_estimator.core.resources import path_string, path_trouble, shown_path

    name = shown_path(path)
    if path_trouble(path) is None and not os.path.exists(path_string(path)):
        verdict = Verdict(name, problems=(Problem("file-not-found", name, "no such file"),))
        return comparison.LogComparison(name, verdict)
    inp, problems, log = _log_input(path, _release(release))
    notes: list[str] = []
    if budget is None and log.out_of_memory:
        budget = max(o.total_capacity for o in log.out_of_memory)
        budget_source = f"the total capacity the out-of-memory message names ({log.out_of_memory[0].location})"
    overheads = overheads or Overheads()
    verdict = evaluate(inp, world_size=world_size, world_size_source="--world-size" if world_size else None,
                       budget=budget, budget_source=budget_source, overheads=overheads, environ=environ,
                       problems=problems)
    if verdict.estimate is None:
        return comparison.LogComparison(name, verdict)
    estimate = verdict.estimate
    tp_pp_dp = bool(inp.raw.value("use_tp_pp_dp_mapping", False))
    if not log.memory:
        notes.append("the log has no report_memory lines ('[Rank N] ... memory (MB) | allocated: ...'), "
                     "which Megatron prints after the first iterations and every --log-memory-interval")
    beyond = sorted({r.rank for r in log.memory if r.rank >= estimate.world_size})
    if beyond:
        notes.append(f"ranks {beyond} are outside the world size {estimate.world_size}: not compared")
    ranks = comparison.compare_ranks(log, estimate, tp_pp_dp, overheads.fragmentation)
    notes += comparison.timing_notes(log, ranks)
    ooms = comparison.compare_ooms(log, estimate, tp_pp_dp)
    suggested = None
    if suggest_settings:
        from types import SimpleNamespace

        # The communicators the estimate adds NCCL buffers for (model/stage.py).
        layout = SimpleNamespace(**estimate.parallelism)
        count = len(communicators(layout, bool(inp.raw.value("num_experts"))))
        suggested = comparison.suggest_settings(log, ranks, count, overheads.cuda_context_bytes,
                                                overheads.nccl_bytes_per_communicator, overheads.fragmentation)
    return comparison.LogComparison(name, verdict, ranks, ooms, suggested, tuple(notes))


@checked
def megatron_release_label(text: str) -> tuple[str, str]:
    """``(label, warning)`` of the supported Megatron release ``text`` names (``0.16``, ``main``,
    ``0.18.0rc0``); ``ValueError`` naming the supported releases otherwise."""
    from megatron_estimator.megatron.releases import choose_release
    return choose_release(text)
