"""Pipeline parallelism: the layer split (even, uneven, layouts, hybrid patterns), virtual stages
and the schedule's options.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.hybrid import pattern_problems, segment_count
from megatron_estimator.config.layout_syntax import LayoutSyntaxError, parse_layout
from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _flag, _int, _ints, _size


def _counted_layers(ns: Namespace) -> int:
    return ns["num_layers"] + bool(ns.get("account_for_embedding_in_pipeline_split")) + bool(
        ns.get("account_for_loss_in_pipeline_split"))


def pipeline_split(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args and transformer_config.py __post_init__ (uneven PP, layout).
    if not _ints(ns, "num_layers", "pipeline_model_parallel_size"):
        return
    if segment_count(ns) > 1:
        return          # a hybrid pattern's '|' segments are the split (hybrid_layer_pattern below)
    p, num_layers = ns["pipeline_model_parallel_size"], ns["num_layers"]
    layout = ns.get("pipeline_model_parallel_layout")
    vpp_flags = [d for d in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                             "pipeline_model_parallel_layout") if ns.get(d) is not None]
    if len(vpp_flags) > 1:
        yield Problem("conflicting-virtual-pipeline-flags", raw.location(vpp_flags[1]),
                      "at most one of " + ", ".join(_flag(d) for d in vpp_flags) + " can be set")
        return
    first, last = ns.get("decoder_first_pipeline_num_layers"), ns.get("decoder_last_pipeline_num_layers")
    accounting = ns.get("account_for_embedding_in_pipeline_split") or ns.get("account_for_loss_in_pipeline_split")
    if layout is not None:
        yield from _layout_problems(ns, raw, layout, p, num_layers)
        for dest in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                     "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
            if ns.get(dest):
                yield Problem("layout-conflict", raw.location(dest),
                              f"{_flag(dest)} cannot be combined with --pipeline-model-parallel-layout")
        return
    vpp = ns.get("virtual_pipeline_model_parallel_size")
    if (first is not None or last is not None) and accounting:
        yield Problem("uneven-split-conflict", raw.location(
            "decoder_first_pipeline_num_layers" if first is not None else "decoder_last_pipeline_num_layers"),
            "--decoder-first/last-pipeline-num-layers cannot be combined with "
            "--account-for-embedding/loss-in-pipeline-split")
        return
    if (first is not None or last is not None) and ns.get("num_layers_per_virtual_pipeline_stage") is not None:
        yield Problem("uneven-split-conflict", raw.location("num_layers_per_virtual_pipeline_stage"),
                      "with uneven pipeline stages use --num-virtual-stages-per-pipeline-rank, "
                      "not --num-layers-per-virtual-pipeline-stage")
        return
    if first is not None or last is not None:
        middle_layers = num_layers - (first or 0) - (last or 0)
        middle_stages = p - (first is not None) - (last is not None)
        where = raw.location("decoder_first_pipeline_num_layers" if first is not None
                             else "decoder_last_pipeline_num_layers")
        if middle_stages < 0 or (p == 1):
            yield Problem("uneven-split-invalid", where,
                          f"uneven first/last stages need at least {2 - middle_stages if middle_stages < 0 else 2} pipeline stages; "
                          f"pipeline size is {p}")
            return
        if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
            yield Problem("uneven-split-invalid", where,
                          f"{num_layers} layers - first {first or 0} - last {last or 0} = {middle_layers} "
                          f"middle layers for {middle_stages} middle stages")
            return
        middle_uneven = bool(middle_stages and middle_layers % middle_stages)
        if middle_uneven:
            yield Problem("uneven-split-invalid", where,
                          f"{middle_layers} middle layers do not divide over {middle_stages} middle stages "
                          f"({middle_layers}/{middle_stages} = {middle_layers / middle_stages:g})")
        if vpp:
            for name, count in (("decoder_first_pipeline_num_layers", first),
                                ("decoder_last_pipeline_num_layers", last)):
                if count is not None and count % vpp:
                    yield Problem("uneven-split-vs-vpp", raw.location(name),
                                  f"{_flag(name)} {count} must be divisible by the {vpp} virtual stages per rank")
            if middle_stages and not middle_uneven and (middle_layers // middle_stages) % vpp:
                yield Problem("uneven-split-vs-vpp", raw.location("num_virtual_stages_per_pipeline_rank"),
                              f"{middle_layers // middle_stages} layers per middle stage are not divisible by "
                              f"{vpp} virtual stages per rank")
        return
    counted = _counted_layers(ns)
    extra = ""
    if counted != num_layers:
        extra = f" + {counted - num_layers} (--account-for-embedding/loss-in-pipeline-split) = {counted}"
    if counted % p:
        yield Problem("layers-not-divisible-by-pp", raw.location("num_layers"),
                      f"--num-layers {num_layers}{extra} is not divisible by pp({p}) "
                      f"({counted}/{p} = {counted / p:g}); use --decoder-first/last-pipeline-num-layers "
                      "for an uneven split")
        return
    per_rank = counted // p
    nlpvs = ns.get("num_layers_per_virtual_pipeline_stage")
    if nlpvs is not None and per_rank % nlpvs:
        yield Problem("layers-not-divisible-by-vpp", raw.location("num_layers_per_virtual_pipeline_stage"),
                      f"{per_rank} layers per pipeline stage are not divisible by "
                      f"--num-layers-per-virtual-pipeline-stage {nlpvs}")
    nvspr = ns.get("num_virtual_stages_per_pipeline_rank")
    if nvspr is not None and per_rank % nvspr:
        yield Problem("layers-not-divisible-by-vpp", raw.location("num_virtual_stages_per_pipeline_rank"),
                      f"{per_rank} layers per pipeline stage are not divisible by "
                      f"--num-virtual-stages-per-pipeline-rank {nvspr}")
    if ns.get("account_for_embedding_in_pipeline_split") and vpp is None and per_rank < 1:
        yield Problem("layers-not-divisible-by-pp", raw.location("account_for_embedding_in_pipeline_split"),
                      "not enough layers in the first stage for the embedding")


def _layout_problems(ns: Namespace, raw: RawArgs, layout: str, p: int, num_layers: int) -> Iterator[Problem]:
    # megatron/core/transformer/pipeline_parallel_layer_layout.py
    where = raw.location("pipeline_model_parallel_layout")
    try:
        stages = parse_layout(layout)
    except LayoutSyntaxError as err:
        yield Problem("invalid-layout", where, f"{layout!r} at position {err.position}: {err}")
        return
    if len(stages) % p:
        yield Problem("invalid-layout", where,
                      f"the layout has {len(stages)} stages, not a multiple of pp({p})")
        return
    flat = [c for stage in stages for c in stage]
    mtp = ns.get("mtp_num_layers") or 0
    checks = [
        (flat[:1] == ["E"], "the first layer must be the embedding 'E'"),
        (flat[-1:] == ["L"], "the last layer must be the loss 'L'"),
        (flat.count("E") == 1, f"'E' must appear exactly once (found {flat.count('E')})"),
        (flat.count("L") == 1, f"'L' must appear exactly once (found {flat.count('L')})"),
        (flat.count("t") == num_layers,
         f"the layout has {flat.count('t')} transformer layers 't' but --num-layers is {num_layers}"),
        (flat.count("m") == mtp,
         f"the layout has {flat.count('m')} MTP layers 'm' but --mtp-num-layers is {mtp}"),
    ]
    if "m" in flat:
        checks.append((flat[flat.index("m"):].count("t") == 0, "transformer layers must come before MTP layers"))
    for ok, message in checks:
        if not ok:
            yield Problem("invalid-layout", where, f"{layout!r}: {message}")


def hybrid_layer_pattern(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args, models/hybrid/hybrid_layer_allocation.py,
    # ssm/mamba_mixer.py (config/hybrid.py)
    yield from pattern_problems(ns, raw.location)


def virtual_pipeline(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    vpp = ns.get("virtual_pipeline_model_parallel_size")
    p = ns.get("pipeline_model_parallel_size")
    if not vpp or not isinstance(p, int):
        return
    where = raw.location(next((d for d in ("num_layers_per_virtual_pipeline_stage",
                                           "num_virtual_stages_per_pipeline_rank",
                                           "pipeline_model_parallel_layout") if ns.get(d) is not None),
                              "num_virtual_stages_per_pipeline_rank"))
    # arguments.py: the interleaved schedule needs p > 1 (p > 2 without overlapped p2p).
    if ns.get("overlap_p2p_comm", True) and p <= 1:
        yield Problem("vpp-needs-pipeline", where,
                      f"the interleaved schedule ({vpp} virtual stages) needs pipeline size > 1, got {p}")
        return
    if not ns.get("overlap_p2p_comm", True) and p <= 2:
        yield Problem("vpp-needs-pipeline", where,
                      f"the interleaved schedule without overlapped p2p communication needs pipeline "
                      f"size > 2, got {p}")
        return
    # schedules.py forward_backward_pipelining_with_interleaving
    m = ns.get("num_microbatches")
    group = ns.get("microbatch_group_size_per_vp_stage") or p
    if isinstance(m, int):
        group_where = raw.location("microbatch_group_size_per_vp_stage") if raw.given(
            "microbatch_group_size_per_vp_stage") else raw.location("global_batch_size")
        if group > m or group < p:
            yield Problem("interleaved-microbatches", group_where,
                          f"the interleaved schedule needs pp({p}) <= microbatch group size ({group}) <= "
                          f"microbatches ({m}); microbatches = global batch / (micro batch x dp)")
        elif 0 < m % group < p:
            yield Problem("interleaved-microbatches", group_where,
                          f"{m} microbatches leave a final group of {m % group} (< pp {p}) with groups of "
                          f"{group}; Megatron's interleaved schedule rejects that")


def defer_embedding_wgrad(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/model_parallel_config.py __post_init__ (lines 546, 551, 556)
    if not ns.get("defer_embedding_wgrad_compute"):
        return
    where = raw.location("defer_embedding_wgrad_compute")
    if _size(ns, "pipeline_model_parallel_size") == 1:
        yield Problem("defer-embedding-wgrad", where,
                      "--defer-embedding-wgrad-compute needs pipeline parallelism (--pipeline-model-parallel-size > 1)")
    if not ns.get("gradient_accumulation_fusion", True):
        yield Problem("defer-embedding-wgrad", raw.location("gradient_accumulation_fusion"),
                      "--defer-embedding-wgrad-compute needs gradient-accumulation fusion; drop "
                      "--no-gradient-accumulation-fusion")
    limit = _int(ns.get("wgrad_deferral_limit"))
    if limit is not None and limit < 0:
        yield Problem("defer-embedding-wgrad", raw.location("wgrad_deferral_limit"),
                      f"--wgrad-deferral-limit must be 0 or more with --defer-embedding-wgrad-compute (it is {limit})")


def p2p_warmup_flush(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/model_parallel_config.py __post_init__ (line 572): overlapped p2p in warmup
    # and flush needs overlapped, not batched, p2p; validate_args turns the overlap off without
    # the interleaved schedule, and argument_utils.py batches p2p exactly when it is off.
    if not ns.get("overlap_p2p_comm_warmup_flush"):
        return
    if ns.get("virtual_pipeline_model_parallel_size") and ns.get("overlap_p2p_comm", True):
        return
    why = ("--no-overlap-p2p-communication is set" if not ns.get("overlap_p2p_comm", True)
           else "without virtual pipeline stages Megatron turns p2p overlap off")
    yield Problem("p2p-warmup-flush", raw.location("overlap_p2p_comm_warmup_flush"),
                  "--overlap-p2p-communication-warmup-flush needs overlapped p2p communication, which needs the "
                  f"interleaved schedule (--num-virtual-stages-per-pipeline-rank); {why}")
