"""The training schedule: batch sizes and their ramp-up, iterations against samples, learning rates,
data sources, deprecated flags.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _flag, _int, _ints, _release_said, release_behaviour


def batch_sizes(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/num_microbatches_calculator.py
    if not _ints(ns, "micro_batch_size", "global_batch_size", "data_parallel_size"):
        return
    mbs, gbs, dp = ns["micro_batch_size"], ns["global_batch_size"], ns["data_parallel_size"]
    if gbs % (mbs * dp):
        yield Problem("global-batch-not-divisible", raw.location("global_batch_size"),
                      f"--global-batch-size {gbs} is not divisible by micro batch ({mbs}) x "
                      f"data parallel ({dp}) = {mbs * dp}")


def deprecated(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args: removed flags that Megatron rejects.
    replacements = {
        "batch_size": "--micro-batch-size",
        "warmup": "--lr-warmup-fraction",
        "model_parallel_size": "--tensor-model-parallel-size",
        "checkpoint_activations": "--recompute-activations or --recompute-granularity",
    }
    for dest, replacement in replacements.items():
        if raw.given(dest) and ns.get(dest) not in (None, False):
            yield Problem("deprecated-flag", raw.location(dest),
                          f"{_flag(dest)} is no longer valid; use {replacement}")


def training_schedule(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args: learning rate and iteration-vs-sample training.
    lr, min_lr = ns.get("lr"), ns.get("min_lr")
    if isinstance(lr, (int, float)) and isinstance(min_lr, (int, float)) and min_lr > lr:
        yield Problem("min-lr-exceeds-lr", raw.location("min_lr"), f"--min-lr {min_lr} exceeds --lr {lr}")
    # arguments.py validate_args asserts iteration- or sample-based training (d98e8a64 lines
    # 1276-1295; core_v0.14.0 lines 696-715); from 0.17.0 not under --skip-train (29e798a48d).
    skip = ns.get("skip_train") and release_behaviour("iters_samples_checked_under_skip_train", run) == "0"
    if ns.get("train_iters") and ns.get("train_samples") and not skip:
        yield Problem("iters-and-samples", raw.location("train_samples"),
                      "--train-iters and --train-samples cannot both be set")
    if not skip:
        yield from _schedule_units(ns, raw)
    if ns.get("save") is not None and not ns.get("save_interval"):
        yield Problem("save-needs-interval", raw.location("save"), "--save needs a positive --save-interval")
    # arguments.py validate_args: under --save (core_v0.14.0 lines 779-783, d98e8a64 1361-1366)
    retain, interval = _int(ns.get("save_retain_interval")), _int(ns.get("save_interval"))
    if ns.get("save") is not None and retain is not None and interval and interval > 0 \
            and (retain <= 0 or retain % interval):
        yield Problem("save-retain-interval", raw.location("save_retain_interval"),
                      f"--save-retain-interval {retain} must be a positive multiple of --save-interval {interval}")
    # the weight-decay schedule (core_v0.14.0 lines 795-802, d98e8a64 1393-1400): constant takes
    # --weight-decay alone; linear / cosine need both ends
    style = ns.get("weight_decay_incr_style") or "constant"
    for dest in ("start_weight_decay", "end_weight_decay"):
        if (ns.get(dest) is None) != (style == "constant"):
            yield Problem("weight-decay-schedule", raw.location(dest if style == "constant" else "weight_decay_incr_style"),
                          f"{_flag(dest)} cannot be used with --weight-decay-incr-style constant" if style == "constant"
                          else f"--weight-decay-incr-style {style} needs {_flag(dest)}")
    # the dataset builder (core_v0.14.0 line 681, d98e8a64 line 1258)
    threads = _int(ns.get("num_dataset_builder_threads"))
    if threads is not None and threads <= 0:
        yield Problem("out-of-range", raw.location("num_dataset_builder_threads"),
                      f"{threads} is out of range: must be >= 1")
    sources = [d for d in ("mock_data", "data_path") if ns.get(d)]
    if len(sources) > 1:
        yield Problem("multiple-data-sources", raw.location("mock_data"),
                      "--mock-data and --data-path cannot both be set")


# arguments.py validate_args: with iteration-based training (--train-iters) the learning-rate
# schedule is in iterations, with sample-based (--train-samples) in samples (core_v0.14.0 lines
# 696-724, d98e8a64 lines 1276-1302; 0.17.0 on, not under --skip-train: see training_schedule).
_ITERATION_BASED = (("lr_decay_samples", "expected iteration-based learning rate decay"),
                    ("lr_warmup_samples", "expected iteration-based learning rate warmup"))
_SAMPLE_BASED = (("lr_decay_iters", "expected sample-based learning rate decay"),
                 ("lr_warmup_iters", "expected sample-based learning rate warmup"))


def _schedule_units(ns: Namespace, raw: RawArgs) -> Iterator[Problem]:
    for based, wrong, warmup in (("train_iters", _ITERATION_BASED, "lr_warmup_iters"),
                                 ("train_samples", _SAMPLE_BASED, "lr_warmup_samples")):
        if not ns.get(based):
            continue
        for dest, why in wrong:
            if ns.get(dest):        # lr_decay_* default None, lr_warmup_* default 0
                yield Problem("schedule-units", raw.location(dest),
                              f"{_flag(dest)} cannot be used with {_flag(based)}: {why}")
        if ns.get("lr_warmup_fraction") is not None and ns.get(warmup):
            yield Problem("schedule-units", raw.location(warmup),
                          f"--lr-warmup-fraction and {_flag(warmup)} cannot both be set")


def step_batch_size_schedule(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (main d98e8a64): a step batch-size schedule
    # and an explicit --global-batch-size cannot both be given (ValueError).
    if ns.get("step_batch_size_schedule") is not None and raw.given("global_batch_size") \
            and ns.get("global_batch_size") is not None:
        yield Problem("step-schedule-with-global-batch", raw.location("global_batch_size"),
                      "--global-batch-size cannot be combined with --step-batch-size-schedule "
                      "(the schedule sets the global batch size)")


def rampup_with_train_iters(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    """megatron/training/arguments.py validate_args through 0.17: iteration-based training
    (--train-iters) asserts no --rampup-batch-size (from 29e798a48d, 0.17, not under
    --skip-train); 532ad926b4 (0.18) replaced the rampup scheduler and dropped the check."""
    when = release_behaviour("rampup_with_train_iters_rejected", run)
    if not ns.get("rampup_batch_size") or not ns.get("train_iters") or when == "never" \
            or when == "unless_skip_train" and ns.get("skip_train"):
        return
    yield Problem("rampup-with-train-iters", raw.location("rampup_batch_size"),
                  f"--rampup-batch-size cannot be used with iteration-based training (--train-iters) in "
                  f"{_release_said(run)}; give --train-samples instead")
