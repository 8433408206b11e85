"""From raw settings to a validated configuration: defaults, schema, derivation, rules.

``resolve_config`` is the one door from ``RawArgs`` (what the user typed, in any format) to
``EstimatorConfig`` (what it means).  It gathers every problem and raises them together.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Mapping

from megatron_estimator.core.limits import world_size_problem
from megatron_estimator.config.family import unsupported_model
from megatron_estimator.config.hybrid import normalize_namespace, unified_pattern
from megatron_estimator.config.run_context import RunContext, resume_of
from megatron_estimator.config.typed import EstimatorConfig, build_config
from megatron_estimator.config.derive import derive_namespace
from megatron_estimator.config.distillation import with_distillation
from megatron_estimator.core.problems import InvalidInput, Problem, ProblemCollector
from megatron_estimator.megatron.flags import flag_table
from megatron_estimator.megatron.releases import DEFAULT_RELEASE, ChosenRelease
from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.inputs.entry_script import ModelFamily
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules import check_rules
from megatron_estimator.config.schema import check_config_schema
from megatron_estimator.config.vocab import unreadable_tokenizer_file, vocabulary_of

# Rules about the job's environment: errors when the environment is the job's own.
ENVIRONMENT_RULES = {"cuda-device-max-connections", "fsdp-cuda-device-max-connections",
                     "deterministic-mode-environment", "transformer-engine-environment",
                     "cuda-graph-nccl-graph-register"}
# What a rule assumed (the GPU generation when none is named): always a note.
ASSUMPTION_RULES = {"gpu-generation-assumed"}

SIZE_DESTS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
              "expert_model_parallel_size", "expert_tensor_parallel_size")


def _smallest_world(ns: Mapping) -> int | None:
    sizes = [ns.get(d) for d in SIZE_DESTS]
    sizes[4] = sizes[4] if sizes[4] is not None else sizes[0]
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in sizes):
        return None
    tp, pp, cp, ep, etp = sizes
    return ParallelDims.smallest_world(tp, pp, cp, ep, etp)


def resolve_world_size(raw: RawArgs, world_size: int | None, source: str | None, release: str
                       ) -> tuple[int | None, str]:
    if world_size is not None:
        return world_size, source or "--world-size"
    namespace = flag_table(release).defaults()       # a fresh dict
    namespace.update({d: s.value for d, s in raw.settings.items()})
    smallest = _smallest_world(namespace)
    return smallest, "the smallest world the layout needs (data parallel 1)"


def resolve_config(raw: RawArgs, *, world_size: int | None = None, world_size_source: str | None = None,
                   environ: Mapping[str, str] | None = None,
                   compute_capability: float | None = None,
                   flash_attn: str | None = None, resume: str = "auto",
                   job_environment: bool = False, launch_location: str | None = None,
                   family: ModelFamily | None = None, transformer_engine: str | None = None,
                   release: ChosenRelease = DEFAULT_RELEASE,
                   assumed_compute_capability: float | None = None) -> EstimatorConfig:
    """``compute_capability``: the GPU's, when the user named one (checks that depend on the
    GPU, such as CUDA_DEVICE_MAX_CONNECTIONS before Blackwell, assume
    ``assumed_compute_capability`` when it is None, and say so in a note; with neither they do not run).
    ``flash_attn``: the job's flash-attn version, ``"none"``, or None for >= 2.4.1 (the
    attention kernel Transformer Engine picks in deterministic mode depends on it).
    ``resume``: whether the run resumes from a checkpoint, ``auto``, ``yes`` or ``no``
    (run_context.py ``resume_of``).
    ``job_environment``: ``environ`` is the launched job's own (``run``, launch scripts); for
    config files it is only the checking shell's, so environment rules become notes.
    ``transformer_engine``: the job's Transformer Engine version, when known (its rules run then).
    ``release``: the Megatron-LM release checked against (its flags, rules and behaviour).
    These become the configuration's ``run`` (run_context.py ``RunContext``).
    ``family``: the model family the entry script and the flags say (None: a GPT decoder); one
    the estimator does not model is refused with a single ``unsupported-model`` problem
    (config/family.py) before any rule of the GPT model runs."""
    if family is not None:
        refusal = unsupported_model(family)
        if refusal is not None:
            raise InvalidInput([refusal])
    environ = os.environ if environ is None else environ
    problems = ProblemCollector()
    table = flag_table(release.version)
    namespace = table.defaults()        # a fresh dict: Megatron's namespace before parsing
    namespace.update({dest: setting.value for dest, setting in raw.settings.items()})
    normalize_namespace(namespace)      # --num-layers and MTP depths from a hybrid layer pattern
    unusable: set[str] = set()
    problems.extend(check_config_schema(namespace, raw, unusable))
    if family is not None and family.name == "hybrid" and unified_pattern(namespace) is None:
        # megatron/core/models/hybrid/hybrid_model.py: without a pattern (main removed the
        # ratio flags) HybridModel builds no decoder layers at all.
        where = family.entry.location if family.entry is not None else "--hybrid-layer-pattern"
        problems.add("missing-hybrid-pattern", where,
                     "a hybrid model needs --hybrid-layer-pattern (for example M*M-): without it megatron-core's "
                     "HybridModel builds no decoder layers")

    world, source = resolve_world_size(raw, world_size, world_size_source, release.version)
    if world is None:
        problems.raise_if_any()
        raise InvalidInput([Problem("unknown-world-size", "--world-size",
                                    "cannot tell the world size; pass --world-size")])
    if world < 1:
        problems.add("out-of-range", source, f"world size {world} must be at least 1")
        problems.raise_if_any()
    if world_size_problem(world) is not None:
        problems.add("world-size-out-of-range", source, world_size_problem(world))
        problems.raise_if_any()
    typed = not problems
    for dest in unusable:
        # A value of the wrong type or range is set aside (Megatron's default stands in), so
        # that the rules below still check everything else: every problem at once.
        namespace[dest] = table.namespace_default(dest)

    tokenizer_defaulted = namespace.get("tokenizer_type") is None    # derive fills pretrain_gpt.py's
    derived, notes = derive_namespace(namespace, world, release)
    derived["world_size_source"] = source
    run = RunContext(gpu_compute_capability=compute_capability, flash_attn=flash_attn,
                     resume=resume_of(derived, resume), job_environment=job_environment,
                     launch_location=launch_location, transformer_engine=transformer_engine, release=release,
                     assumed_compute_capability=assumed_compute_capability)
    try:
        rule_problems = check_rules(derived, raw, environ, run)
    except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError):
        if typed:
            raise
        rule_problems = []        # a rule tripped on a value set aside: its own problem is reported
    for problem in [p for p in rule_problems if p.code in ASSUMPTION_RULES]:
        rule_problems.remove(problem)
        notes.append(problem.message)
    if not job_environment:
        for problem in [p for p in rule_problems if p.code in ENVIRONMENT_RULES]:
            rule_problems.remove(problem)
            notes.append(f"job environment (not checked here): {problem.message}")
    problems.extend(rule_problems)
    if not typed:
        problems.raise_if_any()     # the vocabulary below needs the types

    vocab = vocabulary_of(derived, derived.get("tensor_model_parallel_size") or 1, release)
    unreadable = unreadable_tokenizer_file(derived)
    if unreadable is not None:
        dest, why = unreadable
        problems.add("unreadable-tokenizer", raw.location(dest), why + "; fix it or pass --vocab-size")
    elif vocab is None:
        where = raw.location("tokenizer_type") if raw.given("tokenizer_type") else raw.location("vocab_size")
        problems.add("unknown-vocab-size", where,
                     f"cannot tell the vocabulary size of tokenizer {derived.get('tokenizer_type')}"
                     + (f" ({derived.get('tokenizer_model')})" if derived.get("tokenizer_model") else "")
                     + ": its files are not on this machine; "
                     + ("pass --vocab-size" if raw.location("vocab_size").startswith("--")
                        else f"set vocab_size ({raw.location('vocab_size')})"))
    problems.raise_if_any()
    if tokenizer_defaulted and vocab.source.startswith("GPT2BPETokenizer"):
        notes.append("tokenizer: GPT2BPETokenizer, pretrain_gpt.py's default --tokenizer-type")
    family_name = family.name if family is not None else "gpt"
    config = build_config(derived, vocab, source, environ, tuple(notes), frozenset(raw.settings), run,
                          family=family_name)
    kd_problems: list[Problem] = []
    config = with_distillation(config, derived, raw, vocab, environ, family_name, kd_problems)
    problems.extend(kd_problems)
    problems.raise_if_any()
    if raw.co_resident:
        config = replace(config, co_resident=tuple(raw.co_resident))
    return config
