"""The layout planner: what it searches, what Megatron accepts, what fits, the order, the
flags it prints, and ``megatron-estimator plan``.

The planner composes the estimator's memory functions with caches; the reference it must
agree with is ``api.evaluate`` on each layout's settings (brute force on small models)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from conftest import LLAMA3_8B, REPO, TINY_GPT, flags
from megatron_estimator import api
from megatron_estimator.planner import candidates as planner_candidates
from megatron_estimator.planner import memory as planner_memory
from megatron_estimator.planner import search as planner_search
from megatron_estimator.planner import space as planner_space
from megatron_estimator.planner import validity as planner_validity
from megatron_estimator.results import plan as plan_records
from megatron_estimator.api import TrainingInput
from megatron_estimator.config.derive import derive_namespace
from megatron_estimator.core.problems import InvalidInput
from megatron_estimator.model.layout import microbatches_in_flight
from megatron_estimator.config.layout_syntax import parse_layout
from megatron_estimator.model.overhead import Overheads

GiB = 1 << 30
CLI = [sys.executable, "-m", "megatron_estimator"]

# DeepSeek-V3 in miniature: multi-latent attention, a dense first layer, 8 experts top-2 with a
# shared expert, one MTP layer, and 5 layers, which no pipeline of 2 or 4 stages splits evenly.
TINY_MOE = (
    "--num-layers 5 --hidden-size 128 --num-attention-heads 8 --num-experts 8 --moe-router-topk 2 "
    "--moe-ffn-hidden-size 64 --moe-layer-freq ([0]+[1]*4) --moe-shared-expert-intermediate-size 64 "
    "--multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 8 "
    "--v-head-dim 16 --qk-layernorm --mtp-num-layers 1 --position-embedding-type rope --swiglu "
    "--normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights --seq-length 64 "
    "--max-position-embeddings 64 --vocab-size 1000 --bf16 --moe-grouped-gemm"
)
SMALL_SPACE = plan_records.SearchSpace(micro_batch_sizes=(1, 2), max_virtual_stages=2,
                                       block_recompute_fractions=(0.5,), max_context_parallel=2)
# Six layers on 8 GPUs: pipelines of 2 and 4 ranks, interleaved with 2 and 3 virtual stages.
SIX_LAYER_GPT = TINY_GPT.replace("--num-layers 4", "--num-layers 6")
INTERLEAVED_SPACE = plan_records.SearchSpace(micro_batch_sizes=(1, 2), max_virtual_stages=3,
                                             block_recompute_fractions=(0.5,), max_context_parallel=2)


def _key(settings) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in dict(settings).items()))


def _evaluate(inp: TrainingInput, settings, world: int, budget: int):
    raw = planner_candidates.layout_raw(inp.raw, settings, "main")
    return api.evaluate(TrainingInput(raw, source="brute force"), world_size=world, world_size_source="test",
                        budget=budget, overheads=Overheads(), environ={})


def brute_force(text: str, world: int, gbs: int, budget: int, space=None):
    """Every layout of the planner's space through api.evaluate: (searched, valid, rejection
    codes, {layout: (device peak, allocated peak, peak rank)} of those that fit)."""
    argv = flags(text)
    inp, problems = api.plan_input(argv, environ={})
    assert not problems
    searched = valid = 0
    codes: dict[str, int] = {}
    fits = {}
    for settings in api.planned_layouts(argv, world_size=world, global_batch_size=gbs, space=space, environ={}):
        searched += 1
        verdict = _evaluate(inp, settings, world, budget)
        if verdict.estimate is None:
            codes[verdict.problems[0].code] = codes.get(verdict.problems[0].code, 0) + 1
            continue
        valid += 1
        peak = verdict.estimate.peak_stage
        if peak.device_peak_bytes <= budget:
            fits[_key(settings)] = (peak.device_peak_bytes, peak.allocated_peak_bytes, peak.pipeline_rank)
    return searched, valid, codes, fits


@pytest.mark.parametrize("text, world, gbs, budget, space", [
    (TINY_GPT, 4, 16, int(1.6 * GiB), None),
    (TINY_MOE, 4, 16, 2 * GiB, SMALL_SPACE),
    (TINY_MOE + " --overlap-grad-reduce --ddp-bucket-size 20000", 4, 16, int(1.8 * GiB), SMALL_SPACE),
    (TINY_GPT + " --use-megatron-fsdp --ckpt-format fsdp_dtensor", 4, 16, int(1.6 * GiB), SMALL_SPACE),
    (TINY_GPT + " --optimizer muon --defer-embedding-wgrad-compute", 4, 16, int(1.6 * GiB), SMALL_SPACE),
    (TINY_MOE + " --overlap-moe-expert-parallel-comm --moe-token-dispatcher-type alltoall "
                "--fine-grained-activation-offloading --offload-modules core_attn expert_fc1", 4, 16, 2 * GiB, SMALL_SPACE),
    (TINY_GPT + " --cpu-offloading-num-layers 1", 4, 16, int(1.6 * GiB), SMALL_SPACE),
    (SIX_LAYER_GPT, 8, 32, int(2.1 * GiB), INTERLEAVED_SPACE),
], ids=["gpt", "moe-mla-mtp", "moe-buckets", "fsdp", "muon-deferred-wgrad", "moe-overlap-offload", "cpu-offload",
        "interleaved-8-gpus"])
def test_every_layout_agrees_with_the_estimator(text, world, gbs, budget, space):
    searched, valid, codes, fits = brute_force(text, world, gbs, budget, space)
    plan = api.plan(flags(text), world_size=world, global_batch_size=gbs, budget=budget, top=None,
                    space=space, environ={})
    assert (plan.searched, plan.valid, plan.fitting) == (searched, valid, len(fits))
    # A layout failing several checks is counted once, under the first the planner's loop meets.
    assert sum(dict(plan.rejections).values()) == searched - valid
    assert set(dict(plan.rejections)) == set(codes)
    assert 0 < len(fits) < valid        # the budget separates layouts that fit from those that do not
    got = {_key(c.settings): (c.device_peak_bytes, c.allocated_peak_bytes, c.peak_stage) for c in plan.candidates}
    assert got == fits
    for c in plan.candidates:
        assert c.estimate is not None and c.estimate.peak_stage.device_peak_bytes == c.device_peak_bytes
        assert c.headroom_bytes == budget - c.device_peak_bytes >= 0


@pytest.mark.parametrize("text, world, gbs, budget, space", [
    (TINY_MOE, 4, 16, 2 * GiB, SMALL_SPACE),
    (SIX_LAYER_GPT, 8, 32, int(2.1 * GiB), INTERLEAVED_SPACE),
    (LLAMA3_8B, 8, 32, 80 * GiB, None),
], ids=["moe", "interleaved", "llama3-8b"])
def test_the_best_are_the_head_of_the_whole_ranking(text, world, gbs, budget, space):
    """The search ranks only the layouts tied on the proxy with the ``top``-th (their peaks made
    exact): the same candidates, in the same order, as ranking every layout that fits."""
    every = api.plan(flags(text), world_size=world, global_batch_size=gbs, budget=budget, top=None, space=space,
                     verify=False, environ={})
    ranked = [(_key(c.settings), c.device_peak_bytes, c.peak_stage, c.proxy.step) for c in every.candidates]
    assert len(ranked) == every.fitting > 20
    for top in (1, 3, 10, 20, every.fitting):
        best = api.plan(flags(text), world_size=world, global_batch_size=gbs, budget=budget, top=top, space=space,
                        verify=False, environ={})
        assert (best.searched, best.valid, best.fitting) == (every.searched, every.valid, every.fitting)
        assert [(_key(c.settings), c.device_peak_bytes, c.peak_stage, c.proxy.step) for c in best.candidates] == \
            ranked[:top]


def test_allocated_limit_is_where_the_device_peak_passes_the_budget():
    from megatron_estimator.model.stage import device_bytes

    rng = random.Random(11)
    for _ in range(3000):
        budget = rng.choice((0, 1, 1000, 80 * GiB, rng.randint(0, 10**12)))
        fixed = rng.choice((0, 1, 5 * 10**8, rng.randint(0, 2 * 10**9)))
        fragmentation = rng.choice((0.0, 0.05, 0.1, 1 / 3, rng.random()))
        most = planner_search.allocated_limit(budget, fixed, fragmentation)
        assert device_bytes(most, fixed, fragmentation) <= budget < device_bytes(most + 1, fixed, fragmentation)


def test_tiny_gpt_counts():
    # 4 GPUs: tp, cp, pp in {1, 2, 4} with tp cp pp | 4; 4 heads; 32 tokens.
    plan = api.plan(flags(TINY_GPT), world_size=4, global_batch_size=16, budget=int(1.6 * GiB), top=3, environ={})
    assert (plan.searched, plan.valid, plan.fitting) == (680, 662, 156)
    assert dict(plan.rejections) == {"global-batch-not-divisible": 12, "interleaved-microbatches": 6}


def llama_plan(extra: str = "", budget: int = 80 * GiB, **kwargs):
    return api.plan(flags(LLAMA3_8B, extra), world_size=8, global_batch_size=32, budget=budget, environ={},
                    **kwargs)


def test_llama3_8b_candidates_reestimated_through_their_flags():
    argv = flags(LLAMA3_8B)
    plan = llama_plan(top=10)
    assert len(plan.candidates) == 10 and plan.fitting > 10
    for c in plan.candidates:
        edited = planner_candidates.candidate_argv(argv, c, "main")
        inp, problems = api.input_from_flags(edited, environ={})
        assert not problems, problems
        verdict = api.evaluate(inp, world_size=8, budget=80 * GiB, environ={})
        assert verdict.problems == () and verdict.estimate is not None, verdict.problems
        peak = verdict.estimate.peak_stage
        assert (peak.device_peak_bytes, peak.allocated_peak_bytes, peak.pipeline_rank) == (
            c.device_peak_bytes, c.allocated_peak_bytes, c.peak_stage)
        assert verdict.estimate.parallelism == c.parallel.as_dict()


def test_llama3_8b_on_8_gpus_what_fits():
    plan = llama_plan(top=None, verify=False)
    fits = {_key(c.settings) for c in plan.candidates}
    assert len(fits) == plan.fitting
    # A whole replica per GPU without the distributed optimizer: 8,030,261,248 parameters x
    # (2 B weight + 4 B fp32 gradient + 12 B master and Adam moments) = 134.6 GiB > 80 GiB.
    for c in plan.candidates:
        p = c.parallel
        assert p.tp * p.pp * p.cp > 1 or c.distributed_optimizer
        assert c.device_peak_bytes <= 80 * GiB
    # Sampled layouts, re-estimated: a layout fits exactly when the planner lists it.
    inp, _ = api.plan_input(flags(LLAMA3_8B), environ={})
    layouts = list(api.planned_layouts(flags(LLAMA3_8B), world_size=8, global_batch_size=32, environ={}))
    assert len(layouts) == plan.searched
    for settings in random.Random(7).sample(layouts, 40):
        verdict = _evaluate(inp, settings, 8, 80 * GiB)
        fits_there = verdict.estimate is not None and verdict.estimate.fits
        assert fits_there == (_key(settings) in fits), settings


def test_ranking_follows_the_proxy():
    plan = llama_plan(top=None, verify=False)
    keys = [(c.proxy.step, c.device_peak_bytes) for c in plan.candidates]
    assert keys == sorted(keys)
    for c in plan.candidates[:200]:
        x = c.proxy
        p = c.parallel
        assert c.num_microbatches == 32 // (c.micro_batch_size * p.dp)
        assert x.bubble == pytest.approx((p.pp - 1) / ((p.vpp or 1) * c.num_microbatches))
        assert x.step == pytest.approx((1 + x.recompute + x.tp_comm + x.cp_comm + x.ep_comm) * (1 + x.bubble) + x.dp_comm)
        if c.recompute.granularity is None:
            assert x.recompute == 0
    by_layout = {}
    for c in plan.candidates:
        by_layout.setdefault((c.parallel, c.pipeline, c.micro_batch_size, c.sequence_parallel,
                              c.distributed_optimizer), {})[c.recompute.label] = c.proxy.step
    pairs = [v for v in by_layout.values() if "none" in v and "full uniform 1" in v]
    assert pairs
    for steps in pairs:
        # Full recompute re-runs every layer's forward: a third of the layers' compute more.
        assert steps["full uniform 1"] > steps["none"]


def test_budget_boundary():
    wide = api.plan(flags(TINY_GPT), world_size=4, global_batch_size=16, budget=4 * GiB, top=None, verify=False,
                    environ={})
    peaks = sorted(c.device_peak_bytes for c in wide.candidates)
    chosen = next(c for c in wide.candidates if c.device_peak_bytes == peaks[len(peaks) // 2])
    at = api.plan(flags(TINY_GPT), world_size=4, global_batch_size=16, budget=chosen.device_peak_bytes,
                  top=None, verify=False, environ={})
    below = api.plan(flags(TINY_GPT), world_size=4, global_batch_size=16, budget=chosen.device_peak_bytes - 1,
                     top=None, verify=False, environ={})
    assert _key(chosen.settings) in {_key(c.settings) for c in at.candidates}
    assert _key(chosen.settings) not in {_key(c.settings) for c in below.candidates}
    assert at.fitting == sum(1 for d in peaks if d <= chosen.device_peak_bytes)
    assert below.fitting == sum(1 for d in peaks if d < chosen.device_peak_bytes)
    assert at.valid == below.valid == wide.valid


def test_nothing_fits():
    plan = llama_plan(budget=4 * GiB)
    assert plan.fitting == 0 and plan.candidates == () and not plan.fits
    assert plan.valid == 5054


def test_flags_are_the_changes_to_the_input():
    extra = "--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer --global-batch-size 32"
    argv = flags(LLAMA3_8B, extra)
    plan = llama_plan(extra, top=None, verify=False)
    same = [c for c in plan.candidates if c.parallel.tp == 2 and c.parallel.pp == 1 and c.parallel.cp == 1
            and c.sequence_parallel and c.distributed_optimizer and c.micro_batch_size == 1
            and c.recompute.granularity is None]
    assert len(same) == 1 and same[0].flags == () and same[0].remove_flags == ()
    other = next(c for c in plan.candidates if c.parallel.tp == 1 and not c.distributed_optimizer
                 and c.recompute.label == "full uniform 1")
    assert other.flags[:2] == ("--tensor-model-parallel-size", "1")
    assert {"--recompute-granularity", "--recompute-method", "--recompute-num-layers"} <= set(other.flags)
    assert set(other.remove_flags) == {"--sequence-parallel", "--use-distributed-optimizer"}
    for c in (same[0], other):
        inp, problems = api.input_from_flags(planner_candidates.candidate_argv(argv, c, "main"), environ={})
        assert not problems
        verdict = api.evaluate(inp, world_size=8, budget=80 * GiB, environ={})
        assert verdict.estimate.peak_stage.device_peak_bytes == c.device_peak_bytes


def test_the_users_split_is_one_choice():
    extra = "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 3"
    plan = api.plan(flags(TINY_GPT, extra), world_size=4, global_batch_size=16, budget=4 * GiB, top=None,
                    verify=False, environ={})
    given = [c for c in plan.candidates if c.pipeline.label.startswith("as given")]
    assert given and all(c.parallel.pp == 2 for c in given)
    assert not {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"} & set(given[0].flags)
    even = next(c for c in plan.candidates if c.parallel.pp == 4)
    assert set(even.remove_flags) >= {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"}
    inp, _ = api.input_from_flags(planner_candidates.candidate_argv(flags(TINY_GPT, extra), even, "main"), environ={})
    verdict = api.evaluate(inp, world_size=4, budget=4 * GiB, environ={})
    assert verdict.estimate.peak_stage.device_peak_bytes == even.device_peak_bytes


def test_deepseek_v3_split_choices():
    # 61 layers (prime): no even split for pp > 1.
    assert [c.label for c in planner_space.pipeline_choices(61, 1, 16, 1)] == ["first 2, middle 4, last 3"]
    assert dict(planner_space.pipeline_choices(61, 1, 16, 1)[0].settings) == {
        "decoder_first_pipeline_num_layers": 2, "decoder_last_pipeline_num_layers": 3}
    # 2 virtual stages: every count would have to be even, so a layout string spreads the layers.
    layout = dict(planner_space.pipeline_choices(61, 1, 16, 2)[1].settings)["pipeline_model_parallel_layout"]
    stages = parse_layout(layout)
    assert len(stages) == 32 and sum(s.count("t") for s in stages) == 61
    assert stages[0][0] == "E" and stages[-1][-2:] == ("m", "L")
    assert max(s.count("t") for s in stages) == 2
    # LLaMA-3-8B, 32 layers on 4 ranks: even splits for 1, 2, 4 and 8 virtual stages.
    even = [c for c in planner_space.pipeline_choices(32, 0, 4, 8) if c.label.startswith("even")]
    assert [c.vpp for c in even] == [None, 2, 4, 8]


def test_deepseek_v3_on_1024_h100():
    space = plan_records.SearchSpace(max_context_parallel=1, micro_batch_sizes=(1,), max_virtual_stages=1,
                                     distributed_optimizer=(True,), block_recompute_fractions=())
    plan = api.plan("deepseek-v3", world_size=1024, global_batch_size=4096, gpu="h100",
                    extra_flags=flags("--seq-length 4096 --bf16"), top=None, verify=False, space=space,
                    environ={})
    assert plan.fits and plan.source == "--model deepseek-v3 + command line"
    # 58 MoE layers of 256 experts x 3 x 7168 x 2048 parameters, with 2 B weights and 4 B
    # gradients each: a stage holds 3.9e12 / (ep etp pp) bytes of them, over 79.2 GiB below 64.
    for c in plan.candidates:
        p = c.parallel
        assert p.ep * p.etp * p.pp >= 64
    best = plan.candidates[0]
    checked = api.plan("deepseek-v3", world_size=1024, global_batch_size=4096, gpu="h100",
                       extra_flags=flags("--seq-length 4096 --bf16"), top=1, space=space, environ={})
    assert checked.candidates[0].device_peak_bytes == best.device_peak_bytes
    assert checked.candidates[0].estimate.peak_stage.pipeline_rank == best.peak_stage


def test_invalid_input_reports_every_problem():
    with pytest.raises(InvalidInput) as err:
        api.plan(flags(TINY_GPT, "--num-layer 4"), world_size=0, global_batch_size=0, budget="80GiB", environ={})
    codes = sorted(p.code for p in err.value.problems)
    assert codes == ["invalid-world-size", "out-of-range", "unknown-flag"]
    with pytest.raises(InvalidInput) as err:
        api.plan("llama3-8bb", world_size=8, global_batch_size=32, budget="80GiB", environ={})
    assert [p.code for p in err.value.problems] == ["unknown-preset"]
    assert "did you mean llama3-8b?" in err.value.problems[0].message
    with pytest.raises(InvalidInput) as err:
        api.plan(flags(TINY_GPT), world_size=4, global_batch_size=16, environ={})
    assert [p.code for p in err.value.problems] == ["missing-budget"]


def test_no_valid_layout():
    # One head (tp 1), a sequence of 2 (cp > 1 needs a multiple of 2 cp), 3 layers (pp <= 3),
    # a global batch of 1 (dp 1): no layout multiplies to 8 GPUs.
    text = ("--num-layers 3 --hidden-size 64 --num-attention-heads 1 --seq-length 2 --max-position-embeddings 2 "
            "--vocab-size 1000 --bf16")
    with pytest.raises(InvalidInput) as err:
        api.plan(flags(text), world_size=8, global_batch_size=1, budget="80GiB", environ={})
    problem, = err.value.problems
    assert problem.code == "no-valid-layout"
    assert problem.message.startswith(f"none of the {err.value.searched} layouts searched on 8 GPUs")
    assert err.value.searched > 0
    for code in ("global-batch-not-divisible", "heads-not-divisible-by-tp", "seq-length-vs-cp"):
        assert code in problem.message
    # The CLI's JSON says how many were searched, as the message does.
    import json
    import subprocess
    import sys

    from conftest import REPO

    result = subprocess.run([sys.executable, "-m", "megatron_estimator", "plan", "--world-size", "8",
                             "--global-batch-size", "1", "--budget", "80GiB", "--format", "json", "--"] + flags(text),
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    assert doc["status"] == "invalid" and doc["searched"] == err.value.searched


# -- the schedule facts the planner relies on (layout.py, by brute force) -----------------------

def test_the_fullest_moment_is_the_heaviest_live_count():
    """The planner's held activations under the interleaved schedule (``_Search.fullest_state``
    and ``fullest_held``, cached on the weights over their greatest common divisor): the largest weighted sum of
    layout.live_states is what microbatches_in_flight's fullest moment holds, for any weights
    (scaled ones, zeros included) and many microbatches."""
    from megatron_estimator.model.layout import live_states

    inp, _ = api.plan_input(flags(TINY_GPT), environ={})
    run = planner_search._Search(inp, 4, 16, GiB, "", Overheads(), {}, SMALL_SPACE, plan_records.ProxyAssumptions())
    rng = random.Random(3)
    checked = 0
    for pp in (2, 3, 4):
        for vpp in (2, 3, 4):
            for group in (pp, 2 * pp):
                for m in list(range(1, 6 * group + 2)) + [97, 1000]:
                    for rank in range(pp):
                        for combined in (False, True):
                            every = live_states(pp, rank, vpp, m, group, combined)
                            base = tuple(rng.randint(0, 50) for _ in range(vpp))
                            for weights in (base, tuple(3 * w for w in base), (7,) * vpp, (0,) * vpp,
                                            tuple(rng.choice((0, 1, 10**9)) for _ in range(vpp)),
                                            tuple(rng.randint(-5, 5) for _ in range(vpp))):
                                counts = microbatches_in_flight(pp, rank, vpp, m, group, weights, combined)
                                held = sum(n * w for n, w in zip(counts.chunk_microbatches, weights))
                                assert held == max(0, max(sum(n * w for n, w in zip(s, weights)) for s in every))
                                state = run.fullest_state(pp, rank, vpp, m, group, combined, weights)
                                assert (0 if state is None else sum(n * w for n, w in zip(state, weights))) == held
                                if held:
                                    assert state == counts.chunk_microbatches
                                table = run.fullest_table(pp, rank, vpp, m, group, combined)
                                assert run.fullest_held(pp, rank, vpp, m, group, combined, weights, table) == held
                                checked += 1
    assert checked > 5000


def test_the_lowest_rank_holds_the_most():
    rng = random.Random(5)
    for pp in (2, 3, 4, 6):
        for vpp in (None, 2, 3):
            for m in range(1, 5 * pp):
                weights = tuple(rng.randint(1, 10**6) for _ in range(vpp or 1))
                held = [sum(n * w for n, w in zip(
                    microbatches_in_flight(pp, r, vpp, m, pp, weights).chunk_microbatches, weights)) for r in range(pp)]
                assert held == sorted(held, reverse=True)


def test_overlays_are_what_derivation_gives():
    """The planner derives once per batch choice and lays the expert, recompute and sequence
    parallel choices over it: that must equal deriving each layout from scratch."""
    search_inp, _ = api.plan_input(flags(TINY_MOE, "--recompute-modules core_attn mlp"), environ={})
    base = {**planner_search._Search(search_inp, 8, 16, GiB, "", Overheads(), {}, plan_records.SearchSpace(),
                                     plan_records.ProxyAssumptions()).namespace}
    choice = planner_space.pipeline_choices(5, 1, 2, 1)[0]
    for recompute in (plan_records.NO_RECOMPUTE, plan_records.SELECTIVE_CORE_ATTN,
                      plan_records.Recompute("full", "block", 1)):
        for ep, etp, sp in ((1, 2, True), (4, 1, True), (2, 2, False)):
            ns = dict(base)
            ns.update(planner_space.family_settings(2, 1, 2, choice))
            ns.update({"use_distributed_optimizer": True, "micro_batch_size": 2})
            derived, _ = derive_namespace(ns, 8, search_inp.release)
            laid = {**derived, **planner_validity.expert_overlay(ep, etp),
                    **planner_validity.recompute_overlay(recompute, sp, derived)}
            full = dict(ns)
            full.update(planner_validity.expert_overlay(ep, etp))
            full.update(recompute.settings())
            full["sequence_parallel"] = sp
            if recompute.modules is None:
                full["recompute_modules"] = ["core_attn", "mlp"]
            scratch, _ = derive_namespace(full, 8, search_inp.release)
            assert laid == scratch


def test_cached_stage_parts_are_the_stage_functions():
    """planner.memory's by-layer-kind chunk activations and its stage terms equal
    model/stage.py's ``chunk_activation_bytes`` and ``stage_terms`` on the layout's own
    configuration (pipeline splits of 1, 2 and 4 ranks, with and without virtual stages)."""
    from dataclasses import replace

    from megatron_estimator.model import stage as stage_model

    inp, _ = api.plan_input(flags(TINY_MOE, "--recompute-modules core_attn mlp"), environ={})
    run = planner_search._Search(inp, 8, 16, GiB, "", Overheads(), {}, SMALL_SPACE, plan_records.ProxyAssumptions())
    checked = 0
    for tp, cp, pp, pipeline in run.families():
        if cp != 1:
            continue
        ns = dict(run.namespace)
        ns.update(planner_space.family_settings(tp, cp, pp, pipeline))
        _, namespaces = planner_validity.derive_batches(ns, [(True, 2)], 8, {}, run.megatron)
        family = run.family(pp, pipeline, tp, namespaces[0])
        for ep, etp in run.expert_choices(tp):
            layout = planner_space.LayoutChoice(tp, cp, pp, ep, etp, pipeline)
            memory = planner_memory.LayoutMemory(run, layout, family, namespaces[0])
            for rec in planner_space.recompute_choices(family.max_chunk_layers, (0.5,)):
                for sp in planner_space.sequence_parallel_choices(tp):
                    acts = memory.activations(2, rec, sp)
                    cfg = replace(acts.cfg, training=replace(
                        acts.cfg.training, recompute_granularity=rec.granularity, recompute_method=rec.method,
                        recompute_num_layers=rec.num_layers,
                        recompute_modules=rec.modules or acts.cfg.training.recompute_modules))
                    for group in family.groups:
                        for cid, chunk in zip(group.chunk_ids, group.stage.chunks):
                            assert acts.chunk(cid, chunk, rec) == stage_model.chunk_activation_bytes(cfg, chunk)
                        terms = stage_model.stage_terms(cfg, group.stage, run.overheads, {})
                        assert acts.stage(group, rec) == (terms.chunk_weights, terms.unscheduled)
                        checked += 1
    assert checked > 100


# -- the command line ---------------------------------------------------------------------------

def run(args):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    environ["PYTHONPATH"] = str(REPO)
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=environ, cwd=REPO, timeout=300)


def test_cli_plan_json():
    result = run(["plan", "--world-size", "8", "--budget", "80GiB", "--global-batch-size", "32", "--top", "3",
                  "--format", "json", "--"] + flags(LLAMA3_8B))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {"candidates", "searched", "valid", "fitting", "seconds"} <= set(doc)
    assert doc["status"] == "fits" and doc["budget_bytes"] == 80 * GiB and doc["world_size"] == 8
    assert doc["searched"] == 5224 and doc["valid"] == 5054 and 3 < doc["fitting"] <= doc["valid"]
    assert len(doc["candidates"]) == 3
    expected = {"flags", "remove_flags", "parallelism", "pipeline_split", "micro_batch_size", "num_microbatches",
                "sequence_parallel", "recompute", "distributed_optimizer", "peak_stage", "device_peak_bytes",
                "allocated_peak_bytes", "headroom_bytes", "throughput_proxy"}
    steps = []
    for c in doc["candidates"]:
        assert set(c) == expected
        assert c["headroom_bytes"] == 80 * GiB - c["device_peak_bytes"]
        assert set(c["parallelism"]) == {"tp", "pp", "vpp", "cp", "dp", "ep", "etp", "edp"}
        assert {"step", "bubble", "recompute", "tp_comm", "cp_comm", "ep_comm", "dp_comm"} <= set(c["throughput_proxy"])
        steps.append(c["throughput_proxy"]["step"])
    assert steps == sorted(steps)
    # The first candidate's flags, added to the input, estimate to the same peak.
    edited = flags(LLAMA3_8B) + doc["candidates"][0]["flags"]
    again = run(["estimate", "--world-size", "8", "--budget", "80GiB", "--format", "json", "--"] + edited)
    stages = json.loads(again.stdout)["stages"]
    assert max(s["device_peak_bytes"] for s in stages) == doc["candidates"][0]["device_peak_bytes"]


def test_cli_plan_text_and_exit_codes():
    fits = run(["plan", "--world-size", "4", "--budget", "2GiB", "--global-batch-size", "16", "--top", "2", "--"]
               + flags(TINY_GPT))
    assert fits.returncode == 0, fits.stderr
    assert "searched 680 layouts" in fits.stdout and "#1: " in fits.stdout
    assert "ranked by the relative step time" in fits.stdout
    none = run(["plan", "--world-size", "8", "--budget", "4GiB", "--global-batch-size", "32", "--format", "json", "--"]
               + flags(LLAMA3_8B))
    assert none.returncode == 1
    doc = json.loads(none.stdout)
    assert doc["status"] == "none_fit" and doc["fitting"] == 0 and doc["candidates"] == []
    bad = run(["plan", "--world-size", "8", "--budget", "80GiB", "--global-batch-size", "32", "--"]
              + flags(LLAMA3_8B, "--num-layer 2"))
    assert bad.returncode == 2
    assert "error: --num-layer:" in bad.stdout and "[unknown-flag]" in bad.stdout
    unbudgeted = run(["plan", "--world-size", "8", "--global-batch-size", "32", "--"] + flags(LLAMA3_8B))
    assert unbudgeted.returncode == 2 and "[missing-budget]" in unbudgeted.stdout


def test_cli_plan_preset_with_training_flags():
    result = run(["plan", "--model", "llama3-8b", "--world-size", "8", "--gpu", "h100", "--top", "1", "--format",
                  "json", "--", "--seq-length", "8192", "--global-batch-size", "32", "--bf16"])
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["source"] == "--model llama3-8b + command line"
    assert doc["global_batch_size"] == 32            # taken from the flags
    assert doc["budget_bytes"] == 81082 * (1 << 20)  # the H100's CUDA-visible capacity
    assert len(doc["candidates"]) == 1


def test_markdown_table_keeps_its_columns():
    from megatron_estimator.report.plan import COLUMNS, render_markdown

    plan = llama_plan(top=None, verify=False)
    with_layout = [c for c in plan.candidates if c.pipeline.label.startswith("layout")][:3]
    assert with_layout
    shown = plan_records.Plan(**{**plan.__dict__, "candidates": tuple(with_layout)})
    rows = [line for line in render_markdown(shown).splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + len(with_layout)
    for row in rows:
        cells = row.replace("\\|", "").split("|")
        assert len(cells) == len(COLUMNS) + 3        # the columns, the flags, and the two ends


def test_plan_and_suggestions_leave_the_hosts_garbage_collector_alone(monkeypatch):
    # A library call must not switch off the caller's cyclic garbage collector: gc.disable is
    # replaced by a failure, and a plan and a refusal's suggestions still run.
    import gc

    def refuse():
        raise AssertionError("gc.disable() called by the library")

    monkeypatch.setattr(gc, "disable", refuse)
    plan = api.plan(flags(TINY_GPT), world_size=4, global_batch_size=16, budget="80GiB", environ={}, top=2)
    assert plan.fitting > 0
    verdict = api.evaluate(api.input_from_flags(flags(TINY_GPT, "--tensor-model-parallel-size 2"), environ={})[0],
                           world_size=4, budget=1 << 20, environ={}, suggest=True)
    assert verdict.estimate is not None and verdict.estimate.fits is False and verdict.suggestions is not None
    assert gc.isenabled()
