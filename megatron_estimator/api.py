"""The Python API: from any input (flags, a file, a mapping) to an estimate.

::

    import megatron_estimator as me
    result = me.estimate(["--num-layers", "32", ...], world_size=8, budget="80GiB")
    result.fits, result.peak_stage.device_peak_bytes, result.stages, result.assumptions

Invalid input raises ``megatron_estimator.InvalidInput`` carrying every problem.  The CLI,
the pytest plugin and the planner are built on ``load_input`` and ``evaluate``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from megatron_estimator.core.problems import InvalidInput, Problem, ProblemCollector
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.results.estimate import Estimate, Verdict


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


def _environment(base: Mapping[str, str] | None, extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(extra)
    return env


def input_from_flags(argv: Sequence[str], *, environ: Mapping[str, str] | None = None,
                     locations: Sequence[str] | None = None, source: str = "command line"
                     ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """Megatron flags, honouring ``--yaml-cfg`` (Megatron then ignores the other flags)."""
    from megatron_estimator.megatron.flags import parse_megatron_argv

    yaml_path = None
    if any(token == "--yaml-cfg" or token.startswith("--yaml-cfg=") for token in argv):
        from megatron_estimator.inputs.megatron_yaml import yaml_cfg_path

        yaml_path = yaml_cfg_path(argv)
    if yaml_path is not None:
        from megatron_estimator.inputs.megatron_yaml import flags_ignored_by_yaml_cfg, load_megatron_yaml

        env = _environment(environ, {})
        loaded = load_megatron_yaml(yaml_path, env)
        ignored = flags_ignored_by_yaml_cfg(argv)
        notes = ()
        if ignored:
            notes = (f"--yaml-cfg {yaml_path} replaces the command line: Megatron ignores "
                     + ", ".join(ignored),)
        return TrainingInput(loaded.raw, source=f"{source} (--yaml-cfg {yaml_path})", notes=notes), tuple(loaded.problems)
    raw, problems = parse_megatron_argv(list(argv), locations=list(locations) if locations else None, source=source)
    return TrainingInput(raw, source=source), tuple(problems)


def input_from_model(flags: Sequence[str], *, hf_config: str | None = None, model: str | None = None,
                     environ: Mapping[str, str] | None = None) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """A HuggingFace config.json (``--hf-config``) or a named preset (``--model``) supplies the
    architecture; Megatron flags add to it or override it.  The notes show the flags the
    architecture maps to, so the user sees what was assumed."""
    if hf_config is not None:
        from megatron_estimator.inputs.hf import load_hf_config

        imported = load_hf_config(hf_config)
        label = f"--hf-config {hf_config}"
    else:
        from megatron_estimator.inputs.presets import load_preset

        imported = load_preset(model)
        label = f"--model {model}"
    flag_input, flag_problems = input_from_flags(flags, environ=environ) if flags else (
        TrainingInput(RawArgs(), source="command line"), ())
    raw = imported.raw.merged(flag_input.raw) if flag_input.raw.settings else imported.raw
    overridden = sorted(set(imported.raw.settings) & set(flag_input.raw.settings))
    notes = [f"{label} supplies: {imported.command_line()}"] if imported.flags else []
    if overridden:
        notes.append("the command line overrides " + ", ".join("--" + d.replace("_", "-") for d in overridden))
    notes.extend(note.message for note in imported.notes)
    source = label if not flags else f"{label} + command line"
    return (TrainingInput(raw, source=source, notes=tuple(notes) + flag_input.notes),
            tuple(imported.problems) + tuple(flag_problems))


def input_from_launch(argv: Sequence[str], *, environ: Mapping[str, str] | None = None
                      ) -> tuple[TrainingInput, tuple[Problem, ...], Any]:
    """A launch command (torchrun ... pretrain_gpt.py --flags): (input, problems, LaunchCommand)."""
    from megatron_estimator.inputs.launch import parse_launch_command, unknown_world_size_problem

    env = dict(os.environ if environ is None else environ)
    command, problems = parse_launch_command(list(argv), env)
    if command.script is None:
        return TrainingInput(RawArgs(), source="launch command"), tuple(problems), command
    inp, flag_problems = input_from_flags(command.megatron_argv, environ=_environment(env, command.environment_dict),
                                          locations=command.megatron_locations, source=command.script)
    inp = replace(inp, world_size=command.world_size, world_size_source=command.world_size_source,
                  environment=command.environment_dict, job_environment=True,
                  world_size_unknown=unknown_world_size_problem(command) if command.world_size is None else None)
    return inp, tuple(problems) + flag_problems, command


def input_from_mapping(settings: Mapping[str, Any], source: str = "mapping") -> tuple[TrainingInput, tuple[Problem, ...]]:
    """A mapping of Megatron dests (``num_layers``) or flags (``--num-layers``) to values."""
    from megatron_estimator.megatron.flags import closest_flags, flag_table

    table = flag_table()
    problems = ProblemCollector()
    out: dict[str, RawSetting] = {}
    for key, value in settings.items():
        spec = table.by_option(key) if str(key).startswith("-") else table.by_dest(str(key))
        if spec is None:
            option = key if str(key).startswith("-") else "--" + str(key).replace("_", "-")
            hint = closest_flags(option)
            problems.add("unknown-flag", str(key), f"unknown Megatron setting {key!r}"
                         + (f"; did you mean {', '.join(hint)}?" if hint else ""))
            continue
        if spec.action == "store_false" and str(key).startswith("-") and isinstance(value, bool):
            value = not value  # '--no-x': True means the dest is False
        out[spec.dest] = RawSetting(spec.dest, value, f"{source}[{key!r}]")
    return TrainingInput(RawArgs(out, source=source), source=source), problems.problems


def input_from_file(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
                    script_args: Sequence[str] | None = None, world_size_given: bool = False
                    ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """A seed-format YAML, a Megatron ``--yaml-cfg`` YAML, a launch script or a HF config.json.

    For a launch script: ``script_args`` are the arguments it runs with (None: not known), and
    ``world_size_given`` says the caller gives the world size (the launcher's need not resolve)."""
    from megatron_estimator.inputs.detect import detect_format

    name = str(path)
    if not Path(path).exists():
        return TrainingInput(RawArgs(), source=name), (Problem("file-not-found", name, "no such file"),)
    kind = detect_format(path)
    if kind == "mixed-yaml":
        return TrainingInput(RawArgs(), source=name), (Problem(
            "mixed-format", name, "has top-level keys of both YAML formats: model: / parallelism: (the seed "
            "format) and language_model: / model_parallel: (Megatron's --yaml-cfg); a file is one or the other"),)
    if kind == "unknown" and Path(path).is_dir():
        return TrainingInput(RawArgs(), source=name), (Problem(
            "unknown-format", name, "is a directory without a HuggingFace config.json; name a file"),)
    env = dict(os.environ if environ is None else environ)
    if kind == "seed-yaml":
        from megatron_estimator.inputs.seed_yaml import load_seed_yaml

        loaded = load_seed_yaml(path)
        return (TrainingInput(loaded.raw, source=name, world_size=loaded.world_size,
                              world_size_source=f"world_size in {loaded.world_size_location}"
                              if loaded.world_size is not None else None),
                tuple(loaded.problems))
    if kind == "megatron-yaml":
        from megatron_estimator.inputs.megatron_yaml import load_megatron_yaml

        loaded = load_megatron_yaml(path, env)
        return TrainingInput(loaded.raw, source=name), tuple(loaded.problems)
    if kind == "shell":
        from megatron_estimator.inputs.bash.reader import load_launch_script

        script, problems = load_launch_script(path, env, script_args=script_args, world_size_given=world_size_given)
        if script is None or script.command is None or script.command.script is None:
            return TrainingInput(RawArgs(), source=name), tuple(problems)
        run_env = _environment(env, script.environment_dict)
        inp, flag_problems = input_from_flags(script.megatron_argv, environ=run_env,
                                              locations=script.megatron_locations, source=name)
        unknown = None
        if script.world_size is None:
            unknown = Problem("unknown-world-size", script.location,
                              f"the world size is not known ({script.world_size_source}); pass --world-size")
        return (replace(inp, world_size=script.world_size, world_size_source=script.world_size_source,
                        environment=script.environment_dict, job_environment=True, world_size_unknown=unknown,
                        launch_location=script.location),
                tuple(problems) + flag_problems)
    if kind == "hf-config":
        from megatron_estimator.inputs.hf import load_hf_config

        loaded = load_hf_config(path)
        return TrainingInput(loaded.raw, source=name, notes=tuple(
            f"{hf_key} -> {flag} {value}" for hf_key, flag, value in loaded.mapping)), tuple(loaded.problems)
    return TrainingInput(RawArgs(), source=name), (
        Problem("unknown-format", name, "not a seed-format YAML (top-level model: or parallelism:), a "
                "Megatron --yaml-cfg YAML (top-level language_model: or model_parallel:), a launch script "
                "or a HuggingFace config.json (model_type or architectures)"),)


def evaluate(inp: TrainingInput, *, world_size: int | None = None, world_size_source: str | None = None,
             budget: int | None = None, budget_source: str | None = None, overheads=None,
             environ: Mapping[str, str] | None = None, problems: Sequence[Problem] = ()) -> Verdict:
    """Validate and estimate one input; never raises for bad input (the verdict holds the problems)."""
    from megatron_estimator.model.stage import estimate as estimate_memory
    from megatron_estimator.model.overhead import Overheads
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.report.assumptions import state_all

    if problems and not inp.raw.settings:
        return Verdict(inp.source, problems=tuple(problems))
    env = _environment(environ, inp.environment)
    if world_size is None:
        world_size, world_size_source = inp.world_size, inp.world_size_source
    if world_size is None and inp.world_size_unknown is not None and inp.world_size_unknown not in problems:
        problems = tuple(problems) + (inp.world_size_unknown,)
    overheads = overheads or Overheads()
    try:
        config = resolve_config(inp.raw, world_size=world_size, world_size_source=world_size_source,
                                environ=env,
                                compute_capability=overheads.compute_capability if overheads.gpu_known else None,
                                flash_attn=overheads.flash_attn, resume=overheads.resume,
                                launch_location=inp.launch_location,
                                job_environment=inp.job_environment)
    except InvalidInput as err:
        # A key the input already reported (missing, mistyped) makes validation miss it too:
        # one message per problem, the input's own.
        reported = {p.location for p in problems}
        return Verdict(inp.source, problems=tuple(problems) + tuple(
            p for p in err.problems if p not in problems and p.location not in reported))
    if problems:
        # The input had problems of its own (an unknown flag, a bad value): report them, with
        # whatever validation found in the rest, instead of an estimate of something else.
        return Verdict(inp.source, problems=tuple(problems))
    if inp.notes:
        config = replace(config, notes=config.notes + inp.notes)
    result = estimate_memory(config, budget=budget, budget_source=budget_source,
                             overheads=overheads, environ=env)
    return Verdict(inp.source, estimate=replace(result, assumptions=state_all(result.assumed)))


def load_input(config: Any, *, environ: Mapping[str, str] | None = None, world_size_given: bool = False
               ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    if isinstance(config, (str, os.PathLike)) and not str(config).startswith("-"):
        return input_from_file(config, environ=environ, world_size_given=world_size_given)
    if isinstance(config, Mapping):
        return input_from_mapping(config)
    if isinstance(config, Sequence) and not isinstance(config, (str, bytes)):
        return input_from_flags([str(x) for x in config], environ=environ)
    raise TypeError(f"config must be a list of Megatron flags, a path or a mapping, not {type(config).__name__}")


def estimate(config: Any, world_size: int | None = None, budget: int | str | None = None, *,
             environ: Mapping[str, str] | None = None, overheads=None) -> Estimate:
    """Estimate per-stage memory; raises InvalidInput with every problem found."""
    argument_problems: list[Problem] = []
    try:
        budget_bytes, budget_source = _budget(budget)
    except InvalidInput as err:
        argument_problems += err.problems
        budget_bytes, budget_source = None, None
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        argument_problems.append(Problem("invalid-world-size", "world_size",
                                         f"world_size must be a positive integer, not {world_size!r}"))
        world_size = None
    inp, problems = load_input(config, environ=environ, world_size_given=world_size is not None)
    verdict = evaluate(inp, world_size=world_size, world_size_source="world_size argument" if world_size else None,
                       budget=budget_bytes, budget_source=budget_source, overheads=overheads,
                       environ=environ, problems=tuple(argument_problems) + tuple(problems))
    if verdict.estimate is None:
        raise InvalidInput(verdict.problems)
    return verdict.estimate


def _budget(budget: int | str | None) -> tuple[int | None, str | None]:
    """Bytes (an int) or a size (``"80GiB"``); InvalidInput when it is neither or not positive."""
    if budget is None:
        return None, None
    if isinstance(budget, int) and not isinstance(budget, bool):
        if budget <= 0:
            raise InvalidInput([Problem("invalid-budget", "budget", f"budget {budget} bytes must be positive")])
        return budget, f"{budget} bytes"
    from megatron_estimator.core.units import parse_bytes

    if isinstance(budget, bool) or not isinstance(budget, (str, float)):
        raise InvalidInput([Problem("invalid-budget", "budget",
                                    f"budget must be bytes (an int) or a size such as '80GiB', not {budget!r}")])
    size = parse_bytes(str(budget), location="budget")
    if size <= 0:
        raise InvalidInput([Problem("invalid-budget", "budget", f"budget {budget!r} must be more than 0 bytes")])
    return size, f"budget {budget}"
