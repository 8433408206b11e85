"""The command line: ``megatron-estimator estimate | run | check | plan``.

The only module that prints and chooses an exit code: 0 every stage fits (or no budget was
given), 1 a stage exceeds the budget, 2 invalid input or usage.  Heavy modules are imported
inside the command that needs them, so ``--version`` and ``run`` start fast.
"""

from __future__ import annotations

import os
import sys

from typing import Sequence, TYPE_CHECKING
if TYPE_CHECKING:
    import argparse

from megatron_estimator import __version__

EXIT_FITS, EXIT_OVER_BUDGET, EXIT_INVALID = 0, 1, 2

DESCRIPTION = "Will this Megatron-LM configuration fit in GPU memory on every pipeline stage?"

EPILOG = """\
exit codes: 0 every stage fits (or no budget given), 1 a stage is over budget,
2 invalid input or usage.

examples:
  megatron-estimator estimate --world-size 64 --budget 80GiB -- --num-layers 80 ...
  megatron-estimator run --budget 80GiB -- torchrun --nproc-per-node 8 pretrain_gpt.py ...
  megatron-estimator check train.yaml launch.sh
  megatron-estimator plan --world-size 1024 --gpu h100 --global-batch-size 4096 --model deepseek-v3 -- --seq-length 4096 --bf16
"""


class UsageError(Exception):
    pass


def _parser_classes():
    """The parser class (argparse's, with its exit code kept at 2 and no traceback) and the
    formatter for the top-level help."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            raise SystemExit(EXIT_INVALID)

    return Parser, argparse.RawDescriptionHelpFormatter


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("budget and report")
    group.add_argument("--budget", metavar="SIZE",
                       help="GPU memory per device: 80GiB, 80GB, 81920MiB, or a number of GiB")
    group.add_argument("--gpu", metavar="NAME",
                       help="take the budget from a known GPU (h100, a100-80gb, h200, b200, mi300x, ...)")
    group.add_argument("--format", choices=("text", "json", "markdown"), help="report format (default text)")
    group.add_argument("--verbose", action="store_true",
                       help="add each stage's modules (embedding, each layer kind, final norm, MTP, output layer) "
                            "with their parameters, weights, gradients, optimizer states and activations")
    group.add_argument("--world-size", type=int, metavar="N",
                       help="world size; overrides the launcher, WORLD_SIZE and config files")
    group.add_argument("--megatron-version", metavar="X.Y[.Z]",
                       help="the job's Megatron-LM release (0.14 to 0.19, or main); default: read from "
                            "the launched Megatron-LM tree, else $MEGATRON_ESTIMATOR_MEGATRON_VERSION, "
                            "else the newest supported (main)")
    over = parser.add_argument_group("overhead assumptions (outside the allocator)")
    over.add_argument("--cuda-context", metavar="SIZE", help="CUDA context per GPU (default 512MiB)")
    over.add_argument("--nccl-buffers", metavar="SIZE", help="NCCL buffers per communicator (default 512MiB)")
    over.add_argument("--fragmentation", metavar="FRACTION",
                      help="allocator fragmentation as a fraction of allocated memory (default 0.05)")
    over.add_argument("--routing-imbalance", metavar="FRACTION",
                      help="MoE: extra share of routed tokens the busiest expert rank receives; "
                           "the peak and the verdict are for that rank (default 0)")
    over.add_argument("--stack", metavar="NAME=VERSION,...",
                      help="estimate, check: the job's packages where run cannot read them, e.g. "
                           "torch=2.8,flash-attn=none,te=2.x")
    over.add_argument("--flash-attn", metavar="VERSION",
                      help="the job's flash-attn version, or none; deterministic training before Hopper "
                           "falls back to unfused attention without >= 2.4.1 (default: run reads the job's "
                           "package metadata; elsewhere >= 2.4.1)")
    over.add_argument("--resume", choices=("auto", "yes", "no"),
                      help="whether the run resumes from a checkpoint: auto (its --load directory holds one), "
                           "yes or no (default auto)")


def _accept_flags_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--accept-flags", action="append", metavar="=FLAG[,FLAG...]",
                        help="flags unknown to Megatron that the entry script adds itself, accepted when the "
                             "script cannot be read; written --accept-flags=--model-provider,--image-size "
                             "(repeatable)")


def _model_source(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model architecture (flags after '--' add to it or override it)")
    source = model.add_mutually_exclusive_group()
    source.add_argument("--hf-config", metavar="SOURCE",
                        help="a HuggingFace config.json: an existing file or a directory holding one, else "
                             "an inline JSON object ('{\"model_type\": ...}'), else a hub model id "
                             "OWNER/NAME[@REVISION] (read through huggingface_hub and its cache: "
                             "pip install 'megatron-estimator[hub]')")
    source.add_argument("--model", metavar="PRESET",
                        help="a named model: " + ", ".join(_preset_names()))


# -- the seed tool's options (megatron-memory-estimator's estimate_from_hf.py) on estimate and check


def _seed_options(parser: argparse.ArgumentParser) -> None:
    """The seed tool's options: short names of Megatron flags (api.seed_options), --num-gpus
    (= --world-size) and --json (= --format json)."""
    from megatron_estimator.api import seed_options

    group = parser.add_argument_group(
        "seed-style options (megatron-memory-estimator's names; each sets its Megatron flag, overriding the "
        "input's settings as a flag after '--' does; without flags after '--', an estimate takes the seed's "
        "defaults: micro batch 1, sequence 4096, bf16, distributed optimizer, 8 GPUs)")
    for option, flag, kind in seed_options():
        dest = _seed_dest(option)
        if kind == "switch":
            group.add_argument(option, dest=dest, action="store_true", default=None,
                               help=f"{flag} off (the seed's default is on)")
            continue
        said = f"Megatron's {flag}" if flag != option else "as Megatron's flag"
        if kind == "list":
            group.add_argument(option, dest=dest, metavar="A,B,...", help=f"{said}, comma-separated")
        else:
            group.add_argument(option, dest=dest, metavar="N" if flag.endswith(("size", "layers", "rank", "length"))
                               else "VALUE", help=said)
    group.add_argument("--num-gpus", type=int, metavar="N", help="the world size (= --world-size)")
    group.add_argument("--json", action="store_true", default=None, help="the report as JSON (= --format json)")


def _seed_dest(option: str) -> str:
    return "seed_" + option[2:].replace("-", "_")


def _seed_values(ns: argparse.Namespace) -> list[tuple[str, object]]:
    """The seed options given, as ``(option, value)`` for ``api.with_options``; --num-gpus and
    --json set --world-size and --format (UsageError when both are given, differently)."""
    from megatron_estimator.api import seed_options

    ns.world_size_source = None
    if ns.num_gpus is not None:
        if ns.world_size is not None and ns.world_size != ns.num_gpus:
            raise UsageError(f"--num-gpus {ns.num_gpus} and --world-size {ns.world_size} disagree; give one of them")
        ns.world_size, ns.world_size_source = ns.num_gpus, "--num-gpus"
    if ns.json:
        if ns.format not in (None, "json"):
            raise UsageError(f"--json and --format {ns.format} disagree; give one of them")
        ns.format = "json"
    return [(option, value) for option, _, _ in seed_options()
            if (value := getattr(ns, _seed_dest(option))) is not None]


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser_class, raw_description = _parser_classes()
    parser = parser_class(prog="megatron-estimator", description=DESCRIPTION, epilog=EPILOG,
                          formatter_class=raw_description, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"megatron-estimator {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)

    p = sub.add_parser("estimate", help="estimate per-stage memory for Megatron flags",
                       description="Estimate per-stage GPU memory for Megatron flags given after '--'.",
                       allow_abbrev=False)
    _common(p)
    _model_source(p)
    _seed_options(p)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="a variable of the job's environment (repeatable): the rules on the job's environment "
                        "(CUDA_DEVICE_MAX_CONNECTIONS, NVTE_*, NCCL_ALGO, ...) become errors, checked against these "
                        "variables (and this shell's with --job-env); without --env / --job-env they are notes")
    p.add_argument("--job-env", action="store_true",
                   help="this shell's environment is the job's: check the environment rules against it "
                        "(with any --env on top)")
    p.add_argument("megatron_args", nargs=argparse.REMAINDER, metavar="-- MEGATRON_FLAGS")

    p = sub.add_parser("run", help="check a launch command, then run it unchanged if it fits",
                       description="Estimate memory for the launch command after '--'; when every stage "
                                   "fits, replace this process with the command (same argv, same "
                                   "environment). Otherwise print the report to stderr and exit 1.",
                       allow_abbrev=False)
    _common(p)
    p.add_argument("--warn-only", action="store_true", default=None,
                   help="launch even when over budget or invalid (the report goes to stderr)")
    _accept_flags_option(p)
    p.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- LAUNCH_COMMAND")

    p = sub.add_parser("check", help="validate and estimate config files and launch scripts",
                       description="Validate and estimate each file (seed YAML, Megatron --yaml-cfg YAML, Megatron-Bridge YAML, "
                                   "launch/sbatch script, HuggingFace config.json); all files are checked; "
                                   "the exit code is the worst verdict.",
                       allow_abbrev=False)
    _common(p)
    _seed_options(p)
    p.add_argument("--skip-unknown", action="store_true",
                   help="pass over files that are not training inputs instead of calling them invalid "
                        "(for pre-commit and globs): YAML or JSON in none of the formats above, and "
                        "scripts that name no pretrain*.py and none of --num-layers, --hidden-size, "
                        "--num-attention-heads, --yaml-cfg, and flag fragments that start no program. Each is named on stderr and left out of the "
                        "report; a training input that is broken is still invalid")
    _accept_flags_option(p)
    p.add_argument("--summary", action="store_true",
                   help="after the reports, one table across the files (model, layout, GPUs, batch, parameters, "
                        "the peak stage's weights+optimizer and activations, peak, verdict) naming the least "
                        "and the most memory-hungry file")
    p.add_argument("--gpus-per-node", type=int, metavar="N",
                   help="the GPUs of each node the launch scripts run on: what a script's own count of "
                        "them prints (torch.cuda.device_count(), nvidia-smi -L | wc -l); without it such a "
                        "count is unknown where it sizes the launch")
    p.add_argument("--script-arg", action="append", metavar="ARG",
                   help="an argument the launch scripts run with ($1, $2, ... and \"$@\" in them), "
                        "repeated in order; without any, $1... are unset and \"$@\" is empty, as bash has "
                        "them (a notice where they reach the launch)")
    p.add_argument("files", nargs="+", metavar="FILE [-- MEGATRON_FLAGS]",
                   help="the files; Megatron flags after '--' are added to (and override) each file's settings, "
                        "as on the training script's command line (check config.json -- --seq-length 4096 ...)")

    p = sub.add_parser("plan", help="search the parallel layouts that fit the budget, best first",
                       description="Enumerate the layouts Megatron accepts for the model on --world-size GPUs "
                                   "(tp, pp, virtual stages, cp, ep, etp, micro batch, sequence parallel, "
                                   "recompute, distributed optimizer), keep those whose peak stage fits the "
                                   "budget and rank them by a throughput proxy. The model comes from flags "
                                   "after '--', a FILE, --model or --hf-config (flags after '--' then add the "
                                   "training settings). Exit 0 when a layout fits, 1 when none does, 2 on "
                                   "invalid input.",
                       allow_abbrev=False)
    _common(p)
    search = p.add_argument_group("search")
    search.add_argument("--global-batch-size", type=int, metavar="N",
                        help="the global batch size to plan for (default: the input's --global-batch-size)")
    search.add_argument("--top", type=int, default=10, metavar="N",
                        help="how many layouts to report, best first (default 10)")
    search.add_argument("--gpus-per-node", type=int, metavar="N",
                        help="GPUs per node: the largest tensor parallel size, and which groups use the "
                             "fast links (default 8)")
    _model_source(p)
    p.add_argument("inputs", nargs=argparse.REMAINDER, metavar="[FILE] [-- MEGATRON_FLAGS]")

    p = sub.add_parser("compare", help="compare a Megatron training log's measured memory with the estimate",
                       description="Rebuild the configuration from a Megatron training log's arguments block, "
                                   "estimate it, and set each rank's logged max allocated / max reserved "
                                   "(report_memory lines) beside its pipeline stage's estimate, and each CUDA "
                                   "out-of-memory message beside the verdict. Exit 0 when compared, 2 on "
                                   "invalid input (a log without an arguments block).",
                       allow_abbrev=False)
    _common(p)
    p.add_argument("--suggest-settings", action="store_true",
                   help="print the [tool.megatron-estimator] fragmentation, cuda-context and nccl-buffers "
                        "the logged reserved-vs-allocated gaps imply, each with how it was derived")
    p.add_argument("log", metavar="LOG")
    return parser


def _preset_names() -> tuple[str, ...]:
    """The presets shipped as data/presets/<name>.json (read without importing the HF mapping)."""
    from megatron_estimator.core.resources import data_file

    return tuple(sorted(name[:-5] for name in os.listdir(data_file("presets")) if name.endswith(".json")))


def _strip_separator(args: Sequence[str]) -> list[str]:
    args = list(args)
    if args and args[0] == "--":
        args = args[1:]
    return args


def _emit(text: str, stream) -> None:
    stream.write(text)
    stream.flush()


def _options(ns: argparse.Namespace, environ):
    """Settings from the command line, MEGATRON_ESTIMATOR_* variables and config files."""
    from megatron_estimator.settings import load_settings

    cli_values = {
        "budget": ns.budget, "gpu": ns.gpu, "format": ns.format, "cuda-context": ns.cuda_context,
        "nccl-buffers": ns.nccl_buffers, "fragmentation": ns.fragmentation,
        "routing-imbalance": ns.routing_imbalance, "flash-attn": ns.flash_attn, "resume": ns.resume,
        "stack": getattr(ns, "stack", None),
        "warn-only": getattr(ns, "warn_only", None), "accept-flags": getattr(ns, "accept_flags", None),
        "megatron-version": getattr(ns, "megatron_version", None),
    }
    settings, problems = load_settings({k: v for k, v in cli_values.items() if v is not None}, environ=environ)
    return settings, problems, _choose_release(ns, settings)


def _estimate_options(settings) -> dict:
    """The budget (with where it came from) and the overhead assumptions of a ``api.Request``
    (with the ``stack`` setting's facts, ``api.stated_stack``)."""
    from megatron_estimator.api import Sourced, overheads_from_settings, stated_stack

    budget = settings.budget
    overheads, _ = stated_stack(settings, overheads_from_settings(settings))
    return {
        "budget": Sourced(budget, settings.source("budget")) if budget is not None else None,
        "overheads": overheads,
    }


def _given_world_size(value, source):
    """``--world-size`` (None: not given) with its source text, for a ``api.Request``."""
    from megatron_estimator.api import Sourced

    return Sourced(value, source) if value is not None else None


def _stated_stack_records(settings) -> tuple:
    from megatron_estimator.api import overheads_from_settings, stated_stack

    return stated_stack(settings, overheads_from_settings(settings))[1]


def _render(verdicts, fmt: str, verbose: bool = False) -> str:
    from megatron_estimator.report.text import RENDERERS

    return RENDERERS[fmt](verdicts, verbose=verbose)


def _settings(ns: argparse.Namespace, environ, stream):
    """(settings, release, None), or (settings, release, exit code) after reporting bad settings
    on ``stream``."""
    from megatron_estimator.api import Verdict

    settings, problems, release = _options(ns, environ)
    if not problems:
        return settings, release, None
    _emit(_render([Verdict("megatron-estimator settings", problems=tuple(problems))], settings.format), stream)
    return settings, release, EXIT_INVALID


def _with_settings_problems(verdict, problems):
    """The verdict on an input, refused with the bad settings' problems ahead of its own: every
    problem at once (the settings fell back to their next source to check the input)."""
    from megatron_estimator.api import Verdict

    if not problems:
        return verdict
    return Verdict(verdict.source, problems=tuple(problems) + tuple(verdict.problems), notes=verdict.notes)


def cmd_estimate(ns, environ) -> int:
    from megatron_estimator.api import Request, input_from_flags, input_from_model, verdict_of, with_options

    options = _seed_values(ns)
    settings, settings_problems, release = _options(ns, environ)
    args = _strip_separator(ns.megatron_args)
    if ns.hf_config or ns.model:
        inp, problems = input_from_model(args, hf_config=ns.hf_config, model=ns.model, environ=environ,
                                         release=release)
    elif not args:
        raise UsageError("give Megatron flags after '--' (e.g. estimate -- --num-layers 32 ...), "
                         "or --model / --hf-config")
    else:
        inp, problems = input_from_flags(args, environ=environ, release=release)
    # Asked in the seed's style (no Megatron flags after '--'): the seed's defaults.
    inp, problems = with_options(inp, problems, options, flags=args, seed_style=not args, environ=environ)
    inp, job_environ = _job_environment(ns, inp, environ)
    verdict = verdict_of(Request(inp, problems=tuple(problems),
                                 world_size=_given_world_size(ns.world_size, ns.world_size_source),
                                 world_environ=environ, environ=job_environ, suggest=True,
                                 **_estimate_options(settings)))
    verdict = _with_settings_problems(verdict, settings_problems)
    if settings.stack:
        from dataclasses import replace

        verdict = replace(verdict, stack=_stated_stack_records(settings))
    _emit(_render([verdict], settings.format, ns.verbose), sys.stdout)
    return verdict.exit_code


def _job_environment(ns, inp, environ):
    """``estimate --env KEY=VALUE`` (repeatable) and ``--job-env``: the job's environment is
    given, so its rules are errors (as in ``run`` and a launch script).  Returns the input and
    the environment to check it in; without either option, this shell's (its rules stay notes)."""
    if not ns.env and not ns.job_env:
        return inp, environ
    from dataclasses import replace

    given = {}
    for item in ns.env:
        name, sep, value = item.partition("=")
        if not sep or not name or any(c.isspace() or c == "=" for c in name):
            raise UsageError(f"--env {item!r}: give KEY=VALUE, e.g. --env CUDA_DEVICE_MAX_CONNECTIONS=1")
        given[name] = value
    inp = replace(inp, environment={**inp.environment, **given}, job_environment=True)
    return inp, (environ if ns.job_env else {})


def cmd_run(ns, environ) -> int:
    from megatron_estimator.api import Request, Sourced, input_from_launch, verdict_of

    argv = _strip_separator(ns.launch)
    if not argv:
        raise UsageError("give the launch command after '--', e.g. run -- torchrun ... pretrain_gpt.py ...")
    settings, settings_problems, release = _options(ns, environ)
    inp, problems, command = input_from_launch(argv, environ=environ, accept_flags=settings.accept_flags,
                                               release=release)
    options = _estimate_options(settings)
    if options["budget"] is None:
        # No budget from any source: the GPU of the machine the job starts on, from its driver.
        from megatron_estimator.api import driver_gpu_budget, overheads_from_settings

        detected = driver_gpu_budget(environ)
        if detected is not None:
            budget, gpu, source = detected
            options = {"budget": Sourced(budget, source),
                       "overheads": overheads_from_settings(settings, gpu=gpu) if gpu is not None
                       else options["overheads"]}
    # The job's stack (PyTorch, Transformer Engine, flash-attn) from its package metadata; the
    # flash-attn setting, when given, wins.
    from dataclasses import replace

    from megatron_estimator.api import job_stack

    overheads, stack = job_stack({**environ, **inp.environment}, options["overheads"], settings)
    options = {**options, "overheads": overheads}
    verdict = verdict_of(Request(inp, problems=tuple(problems),
                                 world_size=_given_world_size(ns.world_size,
                                                              f"--world-size {ns.world_size} given to the estimator"),
                                 world_size_location="--world-size", say_launch=True, environ=environ, suggest=True,
                                 **options))
    verdict = replace(_with_settings_problems(verdict, settings_problems), stack=stack)
    if verdict.exit_code == EXIT_FITS and verdict.estimate is not None:
        return _launch(command)
    _emit(_render([verdict], settings.format, ns.verbose), sys.stderr)
    if settings.warn_only and command.script is not None:
        sys.stderr.write("megatron-estimator: --warn-only: launching anyway\n")
        sys.stderr.flush()
        return _launch(command)
    return verdict.exit_code


def _launch(command) -> int:
    """exec the launch command; returns only when it cannot be run (exit 2, one message)."""
    from megatron_estimator.api import exec_launch

    try:
        exec_launch(command)
    except OSError as err:
        reason = "not found on PATH" if isinstance(err, FileNotFoundError) and "/" not in command.argv[0] \
            else (err.strerror or str(err))
        sys.stderr.write(f"megatron-estimator run: error: cannot launch {command.argv[0]!r}: {reason}\n")
        return EXIT_INVALID
    return EXIT_INVALID   # not reached: exec replaces the process


def cmd_check(ns, environ) -> int:
    from dataclasses import replace

    from megatron_estimator.api import (Request, Verdict, input_from_file, launched_tree_release,
                                        not_a_training_input, verdict_of, with_options)

    options = _seed_values(ns)
    settings, settings_problems, chosen = _options(ns, environ)
    fmt = settings.format
    # Bad settings are reported first, and the files are still checked (with each bad setting's
    # next source): every problem at once.
    verdicts = [Verdict("megatron-estimator settings", problems=tuple(settings_problems))] if settings_problems else []
    for path in ns.files:
        skipped = not_a_training_input(path) if ns.skip_unknown else None
        if skipped is not None:
            _emit(f"megatron-estimator check: skipped {path}: {skipped}\n", sys.stderr)
            continue
        def read(release):
            inp, file_problems = input_from_file(path, environ=environ, script_args=ns.script_arg,
                                                 world_size_given=ns.world_size is not None,
                                                 gpus_per_node=ns.gpus_per_node,
                                                 accept_flags=settings.accept_flags, release=release)
            if getattr(ns, "megatron_flags", None):
                inp, file_problems = _with_flags(inp, file_problems, ns.megatron_flags, environ, settings)
            if options:
                inp, file_problems = with_options(inp, file_problems, options, flags=ns.megatron_flags or (),
                                                  environ=environ)
            return inp, file_problems

        def check(inp, file_problems):
            verdict = verdict_of(Request(inp, problems=tuple(file_problems),
                                         world_size=_given_world_size(ns.world_size, ns.world_size_source),
                                         environ=environ, suggest=True, **_estimate_options(settings)))
            return replace(verdict, stack=_stated_stack_records(settings)) if settings.stack else verdict

        inp, file_problems = read(chosen)
        try:
            tree = None if _release_given(settings) else launched_tree_release(inp)
        except ValueError as error:     # the launched tree states a release the estimator does not support
            from megatron_estimator.core.problems import Problem

            entry = getattr(inp, "entry", None)
            location = entry.location if entry is not None else path
            message = (f"{error}; give --megatron-version to check it against a supported release instead (its "
                       "flags and rules, not this tree's)")
            verdicts.append(check(inp, (*file_problems, Problem("unsupported-release", location, message))))
            continue
        if tree is None:
            verdicts.append(check(inp, file_problems))
            continue
        # The Megatron-LM tree the script launches says its release: this file is read and
        # checked against it (its flags too), and its report names it.
        inp, file_problems = read(tree) if tree.version != chosen.version else (replace(inp, release=tree),
                                                                                  file_problems)
        verdicts.append(check(inp, file_problems))
        if tree.warning:
            sys.stderr.write(f"megatron-estimator: warning: {path}: {tree.warning}\n")
    if ns.summary:                 # the reports, then one table across the files (not the settings)
        from megatron_estimator.report.summary import render_with_summary

        _emit(render_with_summary(verdicts, verdicts[1 if settings_problems else 0:], fmt, ns.verbose), sys.stdout)
    elif verdicts or fmt == "json":  # every file skipped: nothing to report, but JSON readers get {"results": []}
        _emit(_render(verdicts, fmt, ns.verbose), sys.stdout)
    unchecked = [v.source for v in verdicts if v.estimate is not None and v.estimate.budget_bytes is None]
    if unchecked:
        # A gate without a budget is never silently green (the pre-commit hook runs check).
        _emit(f"megatron-estimator check: warning: no budget given (--budget, --gpu, MEGATRON_ESTIMATOR_BUDGET or "
              f"[tool.megatron-estimator] budget / gpu): {', '.join(unchecked)} estimated but not checked "
              "against GPU memory\n", sys.stderr)
    return max((v.exit_code for v in verdicts), default=EXIT_FITS)


def _with_flags(inp, problems, flags, environ, settings):
    """A file's input with the Megatron flags given after ``check ... --`` laid over it, as they
    would be on the training script's command line (later flags win)."""
    from megatron_estimator.api import input_from_flags
    from dataclasses import replace

    given, flag_problems = input_from_flags(list(flags), environ=environ, source="the flags after --",
                                            accept_flags=settings.accept_flags, release=inp.release)
    return replace(inp, raw=inp.raw.merged(given.raw)), tuple(problems) + tuple(flag_problems)


def _plan_model(ns) -> tuple[str | None, list[str]]:
    """(FILE, Megatron flags) of ``plan``'s positional arguments: an optional file, then '--' flags."""
    args = list(ns.inputs)
    path = None
    if args and args[0] != "--" and not args[0].startswith("-"):
        path = args.pop(0)
    args = _strip_separator(args)
    if path is None and not args and not (ns.hf_config or ns.model):
        raise UsageError("give the model: Megatron flags after '--', a FILE, --model PRESET or --hf-config SOURCE")
    if path is not None and (ns.hf_config or ns.model):
        raise UsageError(f"give one model: {path} or {'--hf-config' if ns.hf_config else '--model'}, not both")
    return path, args


class PlanProgress:
    """The planner's progress callback: where a search that runs past a second stands, on
    ``stream`` (stderr, never stdout): one line each time, or one line rewritten with a
    carriage return when the stream is a terminal (``finish`` ends it)."""

    def __init__(self, stream):
        self.stream = stream
        try:
            self.terminal = stream.isatty()
        except (AttributeError, ValueError):
            self.terminal = False
        self.width = 0

    def __call__(self, state) -> None:
        line = (f"plan: {state.searched:,} layouts searched, {state.fitting:,} fit so far "
                f"(layout family {state.families_started:,} of {state.families:,}, {state.seconds:.0f} s)")
        if self.terminal:
            self.stream.write("\r" + line.ljust(self.width))
            self.width = max(self.width, len(line))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.terminal and self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0


MAX_TOP = 10_000      # plan --top: layouts printed (README.md, Limits)


def cmd_plan(ns, environ) -> int:
    from megatron_estimator.api import overheads_from_settings, plan, plan_input, search_space, world_size_for
    from megatron_estimator.core.problems import InvalidInput, Problem
    from megatron_estimator.report.plan import RENDERERS, render_invalid

    settings, release, failed = _settings(ns, environ, sys.stdout)
    if failed is not None:
        return failed
    fmt = settings.format
    path, flags = _plan_model(ns)
    problems: list = []
    if ns.top is not None and not 1 <= ns.top <= MAX_TOP:
        problems.append(Problem("out-of-range", "--top", f"--top {ns.top} must be from 1 to {MAX_TOP:,}"))
    if ns.gpus_per_node is not None and ns.gpus_per_node < 1:
        problems.append(Problem("out-of-range", "--gpus-per-node", f"--gpus-per-node {ns.gpus_per_node} must be at least 1"))
    given_world, world_problems = world_size_for(None, ns.world_size, environ=environ)
    world = given_world.value if given_world is not None else None
    problems += world_problems
    gbs = ns.global_batch_size
    if (world is None and not world_problems) or gbs is None:
        # The input may say: a launch script or seed YAML gives the world size, the flags the batch.
        inp, input_problems = plan_input(path, extra_flags=flags, preset=ns.model, hf_config=ns.hf_config,
                                         environ=environ, release=release)
        if world is None and not world_problems:
            own_world, world_problems = world_size_for(inp)
            world = own_world.value if own_world is not None else None
            problems += world_problems
        if gbs is None and inp.raw.given("global_batch_size"):
            gbs = inp.raw.value("global_batch_size")
        if gbs is None:                         # given with a value that is no batch size: say so
            given_badly = [p for p in input_problems if p.location.split(" ")[-1] == "--global-batch-size"]
            problems += given_badly
            gbs = 0 if given_badly else None
    if world is None and not world_problems:
        problems.append(Problem("unknown-world-size", "--world-size", "the planner needs the number of GPUs: pass --world-size"))
    if gbs is None:
        problems.append(Problem("missing-global-batch-size", "--global-batch-size",
                                "the planner needs the global batch size: pass --global-batch-size"))
    if settings.budget is None:
        problems.append(Problem("missing-budget", "--budget", "the planner needs a budget: --budget SIZE or --gpu NAME"))
    if problems:
        _emit(render_invalid(problems, fmt), sys.stdout)
        return EXIT_INVALID
    space = search_space(gpus_per_node=ns.gpus_per_node) if ns.gpus_per_node else search_space()
    progress = PlanProgress(sys.stderr)
    try:
        result = plan(path, world_size=world, global_batch_size=gbs, budget=settings.budget,
                      budget_source=settings.source("budget"), extra_flags=flags, preset=ns.model,
                      hf_config=ns.hf_config, top=ns.top, space=space, overheads=overheads_from_settings(settings),
                      environ=environ, progress=progress, release=release)
    except InvalidInput as err:
        progress.finish()
        _emit(render_invalid(err.problems, fmt, searched=getattr(err, "searched", 0)), sys.stdout)
        return EXIT_INVALID
    progress.finish()
    _emit(RENDERERS[fmt](result), sys.stdout)
    return EXIT_FITS if result.fits else EXIT_OVER_BUDGET


def cmd_compare(ns, environ) -> int:
    from megatron_estimator.api import compare_log
    from megatron_estimator.report.compare import RENDERERS

    settings, release, failed = _settings(ns, environ, sys.stdout)
    if failed is not None:
        return failed
    options = _estimate_options(settings)
    result = compare_log(ns.log, world_size=ns.world_size, environ=environ,
                         suggest_settings=ns.suggest_settings, release=release, **options)
    _emit(RENDERERS[settings.format](result), sys.stdout)
    return result.exit_code


def _release_given(settings) -> bool:
    """--megatron-version, the megatron-version setting or $MEGATRON_ESTIMATOR_MEGATRON_VERSION
    (the settings read it): a release asked for wins over everything detected."""
    return settings.entry("megatron-version").given


def _choose_release(ns, settings):
    """The Megatron release (a ``ChosenRelease``) the command reads and checks against, first
    match wins: --megatron-version,
    the megatron-version setting (MEGATRON_ESTIMATOR_MEGATRON_VERSION, a config file), the
    package_info.py of the Megatron-LM tree holding the launched script (or on the job's
    PYTHONPATH), for ``run`` only (the environment is the job's) the installed megatron-core's
    metadata, a NeMo container tag in the launch or its script, else the newest supported
    release."""
    from megatron_estimator.api import choose_megatron_release

    entry = settings.entry("megatron-version")
    given = entry.value if entry.given and entry.source.startswith("command line") else None
    setting = (entry.value, entry.source) if entry.given and given is None else None
    try:
        chosen = choose_megatron_release(given, os.environ, setting=setting,
                                         launch=getattr(ns, "launch", None) or getattr(ns, "files", None)
                                         or _before_separator(getattr(ns, "inputs", None)),
                                         environment_is_jobs=ns.command == "run")
    except ValueError as err:
        raise UsageError(str(err)) from None
    if chosen.warning:
        sys.stderr.write(f"megatron-estimator: warning: {chosen.warning}\n")
    return chosen


def _before_separator(tokens):
    """``estimate FILE -- FLAGS``: the FILE part."""
    tokens = list(tokens or ())
    return tokens[:tokens.index("--")] if "--" in tokens else tokens


COMMANDS = {"estimate": cmd_estimate, "run": cmd_run, "check": cmd_check, "plan": cmd_plan,
            "compare": cmd_compare}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # answered before building the parser: scripts call it to probe
        sys.stdout.write(f"megatron-estimator {__version__}\n")
        return EXIT_FITS
    extra_flags: list[str] = []
    if argv[:1] == ["check"] and "--" in argv:     # check FILE... -- MEGATRON_FLAGS
        cut = argv.index("--")
        argv, extra_flags = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "check":
        ns.megatron_flags = extra_flags
    if ns.command is None:
        parser.print_help(sys.stderr)
        return EXIT_INVALID
    try:
        return COMMANDS[ns.command](ns, os.environ)
    except UsageError as err:
        sys.stderr.write(f"megatron-estimator {ns.command}: error: {err}\n")
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug in the estimator: say so plainly, traceback on request
        if os.environ.get("MEGATRON_ESTIMATOR_DEBUG"):
            raise
        sys.stderr.write(f"megatron-estimator: internal error: {type(err).__name__}: {err}\n"
                         "(a bug in megatron-estimator; set MEGATRON_ESTIMATOR_DEBUG=1 for the traceback)\n")
        return EXIT_INVALID


def entry_point() -> None:
    raise SystemExit(main())
