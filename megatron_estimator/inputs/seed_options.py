"""The seed tool's options on the estimator's command line, and its defaults.

megatron-memory-estimator's ``estimate_from_hf.py`` takes the training layout as short options
(``--tp 4 --pp 2 --num-gpus 16 ...``, ``megatron.short_options``).  ``estimate`` and ``check``
take them too, before ``--``: each sets its Megatron flag's dest, located as the option
(``command line --tp``), and overrides the input's settings as a Megatron flag after ``--``
does.  Given both ways with different values, the two are one ``conflicting-options`` problem.

An estimate asked in the seed's style (a model from ``--hf-config`` / ``--model``, no Megatron
flags after ``--``) takes the seed's defaults where nothing gives a value: its argparse
defaults (micro batch 1, sequence 4096, 8 GPUs, the distributed optimizer), what
``create_args_namespace`` / ``configure_training`` set (grouped GEMM for MoE experts, one recomputed layer with a recompute method), and what the
bridge it builds Megatron's config with sets (mbridge ``mbridge/core/llm_bridge.py``
``_build_base_config``: bf16 weights, ``sequence_parallel = tp_size > 1``,
``moe_token_dispatcher_type = "alltoall"``).
"""

from __future__ import annotations

from typing import Any, Sequence

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.megatron.short_options import ALIASES, COMMA_LISTS, SWITCHES

SOURCE = "command line"
# estimate_from_hf.py ``--num-gpus`` default: the world size of a seed-style estimate that no
# --num-gpus, --world-size, WORLD_SIZE or input gives.
SEED_WORLD_SIZE = 8
SEED_WORLD_SOURCE = f"the seed-style default --num-gpus {SEED_WORLD_SIZE}"


def option_table() -> tuple[tuple[str, str, str], ...]:
    """The options ``read_options`` takes: ``(option, Megatron flag, kind)``, kind ``value``
    (one value), ``list`` (one comma-separated value) or ``switch`` (no value)."""
    return (tuple((option, flag, "list" if option in COMMA_LISTS else "value") for option, flag in ALIASES.items())
            + tuple((option, flag, "switch") for option, (flag, _) in SWITCHES.items()))


def option_location(option: str) -> str:
    """Where a problem with a seed option's value is named: ``command line --tp``."""
    return f"{SOURCE} {option}"


def read_options(given: Sequence[tuple[str, Any]], release: str = "main") -> tuple[RawArgs, tuple[Problem, ...]]:
    """The options given (``("--tp", "2")``; a switch's value is True) as Megatron settings,
    each value converted and checked as Megatron's converter for its flag does
    (``megatron.flags.convert_value``), with every problem."""
    from megatron_estimator.inputs.argv import convert_values
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table(release)
    problems = ProblemCollector()
    settings: dict[str, RawSetting] = {}
    for option, text in given:
        location = option_location(option)
        if option in SWITCHES:
            flag, value = SWITCHES[option]
            spec = table.by_option(flag)
            settings[spec.dest] = RawSetting(spec.dest, value, location)
            continue
        spec = table.by_option(ALIASES[option])
        texts = [part for part in str(text).split(",") if part] if option in COMMA_LISTS else [str(text)]
        if not texts:
            problems.add("missing-value", location, "expects at least one value (comma-separated)")
            continue
        converted = convert_values(spec, texts, location, problems)
        if converted is not None:
            value = converted if spec.nargs in ("+", "*") else converted[0]
            settings[spec.dest] = RawSetting(spec.dest, value, location)
    return RawArgs(settings, SOURCE), problems.problems


def _said(value: Any) -> str:
    return " ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)


def conflicts(options: RawArgs, flags: RawArgs) -> tuple[Problem, ...]:
    """One problem for each setting that a seed option and a Megatron flag after ``--`` both
    give, with different values."""
    found = []
    for dest, setting in options.settings.items():
        if not flags.given(dest) or flags.value(dest) == setting.value:
            continue
        option = setting.location[len(SOURCE) + 1:]
        given = option if option in SWITCHES else f"{option} {_said(setting.value)}"
        other = flags.location(dest)
        value = flags.value(dest)
        if not isinstance(value, bool):
            other += f" {_said(value)}"
        elif value is False:
            other += " (off)"
        found.append(Problem("conflicting-options", setting.location,
                             f"{given} and {other} after '--' set {dest} differently; give one of them"))
    return tuple(found)


def with_seed_defaults(raw: RawArgs) -> tuple[RawArgs, tuple[str, ...]]:
    """``raw`` with the seed's defaults where it gives no value, and the defaults applied in
    words (``micro batch 1``, ...) for the report's assumptions.  The world size is the
    caller's (``SEED_WORLD_SIZE``)."""
    defaults: list[tuple[str, Any, str, str]] = []      # dest, value, flag, words
    defaults.append(("micro_batch_size", 1, "--micro-batch-size 1", "micro batch 1"))
    defaults.append(("seq_length", 4096, "--seq-length 4096", "sequence 4096"))
    if not (raw.value("fp16") or raw.given("bf16")):
        defaults.append(("bf16", True, "--bf16", "bf16"))
    defaults.append(("use_distributed_optimizer", True, "--use-distributed-optimizer", "distributed optimizer"))
    if (raw.value("tensor_model_parallel_size") or 1) > 1:
        # The bridge's TransformerConfig: sequence_parallel = tp_size > 1.
        defaults.append(("sequence_parallel", True, "--sequence-parallel", "sequence parallel (tp > 1)"))
    if raw.value("num_experts"):
        defaults.append(("moe_grouped_gemm", True, "--moe-grouped-gemm", "grouped GEMM for the experts"))
        defaults.append(("moe_token_dispatcher_type", "alltoall", "--moe-token-dispatcher-type alltoall",
                         "alltoall token dispatcher"))
    if raw.value("recompute_method") is not None and raw.value("recompute_granularity") != "selective":
        # configure_training: recompute_num_layers (default 1) goes with a recompute method.
        defaults.append(("recompute_num_layers", 1, "--recompute-num-layers 1", "recompute num layers 1"))
    settings = dict(raw.settings)
    words = []
    for dest, value, flag, said in defaults:
        if dest not in settings:
            settings[dest] = RawSetting(dest, value, f"seed-style default {flag}")
            words.append(said)
    return RawArgs(settings, raw.source, raw.absent, raw.opaque), tuple(words)
