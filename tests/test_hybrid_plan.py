"""The planner and the suggestions on hybrid (Mamba) models.

Brute force, as tests/test_planner.py does for GPT decoders: every layout the planner searches
for a toy hybrid goes through ``api.evaluate``, and the planner's counts, rejections and every
fitting layout's figures must be the normal path's.  The search space itself (which pp and
splits a pattern allows) is derived from Megatron-LM's rules (planner/hybrid.py), not from the
planner's output."""

from __future__ import annotations

import shlex

import pytest

from megatron_estimator import api
from megatron_estimator.results import plan as plan_records

from test_planner import _key, brute_force

GiB = 1 << 30

# tests/test_hybrid.py's toy: h 64, 4 attention heads, Mamba d_inner 128 = 8 heads of 16, state 8,
# 2 groups; 32 tokens of 1000 (-> 1024) words.
TOY = ("--hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
       "--vocab-size 1000 --bf16 --mamba-head-dim 16 --mamba-state-dim 8 --mamba-num-groups 2 "
       "--hidden-dropout 0 --micro-batch-size 1")
MOE = " --num-experts 4 --moe-ffn-hidden-size 32 --moe-router-topk 2"
BUDGET_DSA_OFFSET = 1_500_000_000   # between the fitting layouts with and without vpp
SMALL_SPACE = plan_records.SearchSpace(micro_batch_sizes=(1, 2), max_virtual_stages=2,
                                       block_recompute_fractions=(0.5,), max_context_parallel=2)


def toy(pattern: str, extra: str = "") -> str:
    return f"{TOY} --hybrid-layer-pattern {pattern} {extra}"


def argv(text: str) -> list[str]:
    return shlex.split(text)


def evaluate(text: str, release: str = "main", **kwargs):
    inp, problems = api.load_input(argv(text), release=release)
    return api.evaluate(inp, problems=problems, environ={}, **kwargs)


CASES = [
    (toy("M*M-M*M-"), int(1.7 * GiB), None),
    (toy("M*|M-|M*|M-/M-", "--position-embedding-type rope" + MOE), int(1.7 * GiB), SMALL_SPACE),
    # one segment: Megatron-FSDP has no pipeline parallelism (mcore_fsdp_adapter.py _get_dp_tp_mesh)
    (toy("MM*EMM-E", "--moe-token-dispatcher-type alltoall --use-megatron-fsdp --ckpt-format fsdp_dtensor" + MOE),
     int(2.2 * GiB), SMALL_SPACE),
    (toy("M*M-M*M-", "--fp8-format hybrid --fp8-param-gather --use-distributed-optimizer"), int(1.7 * GiB),
     SMALL_SPACE),
    (toy("M*M-M*M-", "--fine-grained-activation-offloading --offload-modules core_attn attn_proj mlp_norm"),
     int(1.7 * GiB), SMALL_SPACE),
    # 'G' and 'D' layers; with --dsa-indexer-topk-freq 2 layers 2 and 4 reuse the top-k of 1 and 3
    # and build no indexer (dsa.py is_dsa_skip_topk_layer), so one 'D' layer differs from another.
    (toy("DDG-|DDG-", "--sequence-parallel --disable-bias-linear --q-lora-rank 24 --kv-lora-rank 16 "
                      "--qk-head-dim 8 --qk-pos-emb-head-dim 4 --v-head-dim 8 --dsa-indexer-n-heads 2 "
                      "--dsa-indexer-head-dim 8 --dsa-indexer-topk 4 --dsa-indexer-topk-freq 2 "
                      "--position-embedding-type rope --linear-num-key-heads 4 --linear-num-value-heads 8 "
                      "--linear-key-head-dim 8 --linear-value-head-dim 8 --linear-conv-kernel-dim 4"),
     1_718_400_000, SMALL_SPACE),      # between the fitting layouts' device peaks (1.5999 - 1.6005 GiB)
    # --dsa-indexer-skip-topk-offset 5: layers 1-5 compute their top-k, then every other one
    # (dsa.py): the middle segments 'DDDD' (layers 3-6 and 7-10) build 3 and 2 indexers: the
    # same symbols, other tensors.
    (toy("DD|DDDD|DDDD|DD", "--sequence-parallel --disable-bias-linear --q-lora-rank 24 --kv-lora-rank 16 "
                    "--qk-head-dim 8 --qk-pos-emb-head-dim 4 --v-head-dim 8 --dsa-indexer-n-heads 2 "
                    "--dsa-indexer-head-dim 8 --dsa-indexer-topk 4 --dsa-indexer-topk-freq 2 "
                    "--dsa-indexer-skip-topk-offset 5 --position-embedding-type rope"),
     BUDGET_DSA_OFFSET, SMALL_SPACE),
]


@pytest.mark.parametrize("text, budget, space", CASES,
                         ids=["pipe-free", "pipes-moe-mtp", "moe-fsdp", "fp8", "fine-grained-offload", "gdn-dsa-shared-top-k",
                              "dsa-top-k-offset"])
def test_every_hybrid_layout_agrees_with_the_estimator(text, budget, space):
    searched, valid, codes, fits = brute_force(text, 4, 16, budget, space)
    plan = api.plan(argv(text), world_size=4, global_batch_size=16, budget=budget, top=None, space=space,
                    environ={})
    assert (plan.searched, plan.valid, plan.fitting) == (searched, valid, len(fits))
    assert sum(dict(plan.rejections).values()) == searched - valid
    assert set(dict(plan.rejections)) == set(codes)
    assert 0 < len(fits) < valid        # the budget separates layouts that fit from those that do not
    got = {_key(c.settings): (c.device_peak_bytes, c.allocated_peak_bytes, c.peak_stage) for c in plan.candidates}
    assert got == fits
    for c in plan.candidates:           # each re-estimated through api.evaluate (api.plan's verifier)
        assert c.estimate is not None and c.estimate.peak_stage.device_peak_bytes == c.device_peak_bytes
        assert c.estimate.peak_stage.layer_kinds is not None


def _layouts(text: str, world: int, space=None, release: str = "main") -> list[dict]:
    return list(api.planned_layouts(argv(text), world_size=world, global_batch_size=16, space=space,
                                    environ={}, release=release))


def test_a_pattern_with_pipes_fixes_the_split():
    # 4 '|' segments: pp 1, 2 or 4 (divisors of 4; Megatron rejects the others); no split flags,
    # the virtual stages are derived (4 / pp when over 1).
    layouts = _layouts(toy("M*|M-|M*|M-"), 8, SMALL_SPACE)
    assert {s["pipeline_model_parallel_size"] for s in layouts} == {1, 2, 4}
    for s in layouts:
        assert all(s[d] in (None, False) for d in ("num_virtual_stages_per_pipeline_rank",
                                                   "pipeline_model_parallel_layout",
                                                   "decoder_first_pipeline_num_layers"))


def test_a_pattern_without_pipes_splits_evenly_or_first_last_or_is_re_split_with_pipes():
    # 6 layers.  Without '|' (select_pipeline_segment's pipe-free path): pp 2 even, pp 4 first/last
    # (1 + 2 + 2 + 1: the middle even); never virtual stages or a layout string (Megatron refuses
    # both with a hybrid pattern).  Interleaving takes '|' segments: the same layers re-split into
    # pp x v balanced segments, the extra layers mid-model first: pp 2 v 2 = 4 segments 1 2 2 1,
    # pp 2 v 3 = 6 of 1; pp 4 v 2 would need 8 layers.
    layouts = _layouts(toy("M*-M*-"), 4, plan_records.SearchSpace(max_virtual_stages=4))
    assert {s["pipeline_model_parallel_size"] for s in layouts} == {1, 2, 4}
    for s in layouts:
        assert s["num_virtual_stages_per_pipeline_rank"] is None
        assert s["pipeline_model_parallel_layout"] is None
    by_pp = {}
    for s in layouts:
        by_pp.setdefault(s["pipeline_model_parallel_size"], set()).add(
            (s["decoder_first_pipeline_num_layers"], s["decoder_last_pipeline_num_layers"], s.get("hybrid_layer_pattern")))
    assert by_pp[1] == {(None, None, None)}
    assert by_pp[2] == {(None, None, None), (None, None, "M|*-|M*|-"), (None, None, "M|*|-|M|*|-")}
    assert by_pp[4] == {(1, 1, None)}


def test_a_re_split_pattern_replaces_the_deprecated_alias_and_keeps_its_mtp_depths():
    text = (f"{TOY} --hybrid-override-pattern M*-M*-/M-/M- --position-embedding-type rope "
            "--pipeline-model-parallel-size 2")
    plan = api.plan(argv(text), world_size=2, global_batch_size=16, budget=8 * GiB, top=None,
                    space=plan_records.SearchSpace(micro_batch_sizes=(1,), max_virtual_stages=2), environ={})
    resplit = [c for c in plan.candidates if "--hybrid-layer-pattern" in c.flags]
    assert resplit and all(c.parallel.vpp == 2 for c in resplit)
    for c in resplit:            # re-estimated through api.evaluate with these flags (api.plan's verifier)
        assert c.flags[c.flags.index("--hybrid-layer-pattern") + 1] == "M|*-|M*|-/M-/M-"
        assert "--hybrid-override-pattern" in c.remove_flags
        assert c.estimate.peak_stage.layer_kinds in ("M|M*", "*-|-/M-/M-")


def test_the_planner_proposes_no_tp_or_cp_the_mamba_mixer_refuses():
    # Mamba head dim 32: 4 heads, 2 groups.  tp must divide both (mamba_mixer.py): tp <= 2.  Under
    # context parallelism the heads of a TP rank must divide over cp (mamba_context_parallel.py):
    # tp 1 takes cp 1, 2, 4 (not 8), tp 2 (2 heads, 1 group, its state repeated) cp 1, 2 (not 4).
    plan = api.plan(argv(toy("M*M-", "--num-attention-heads 8 --mamba-head-dim 32")), world_size=8,
                    global_batch_size=16, budget=4 * GiB, top=None,
                    space=plan_records.SearchSpace(micro_batch_sizes=(1,), max_context_parallel=8), environ={})
    layouts = {(c.parallel.tp, c.parallel.cp) for c in plan.candidates}
    assert layouts == {(1, 1), (1, 2), (1, 4), (2, 1), (2, 2)}
    assert dict(plan.rejections).get("mamba-shape", 0) > 0
    assert dict(plan.rejections).get("mamba-context-parallel", 0) > 0


@pytest.mark.parametrize("extra, cp, message", [
    ("--mamba-head-dim 32", 8, "does not divide the 4 Mamba heads"),
    # 6 heads of 16 (d_inner 96), 2 groups: cp 3 divides the heads, not the groups (nor they it)
    ("--mamba-num-heads 6 --seq-length 48 --max-position-embeddings 48", 3, "not a multiple of the 2 Mamba groups"),
])
def test_mamba_context_parallel_rules(extra, cp, message):
    verdict = evaluate(toy("M*M-", extra + f" --context-parallel-size {cp}"), world_size=cp)
    codes = [(p.code, p.location) for p in verdict.problems]
    assert codes == [("mamba-context-parallel", "--context-parallel-size")]
    assert message in verdict.problems[0].message and "mamba_context_parallel.py" in verdict.problems[0].message


def test_a_refused_hybrid_launch_gets_suggestions_that_fit():
    # A hybrid whose activations matter: 4096 tokens of micro batch 4, h 1024, 32 Mamba heads of 64.
    text = ("--hidden-size 1024 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings 4096 "
            "--vocab-size 1000 --bf16 --mamba-head-dim 64 --mamba-state-dim 16 --mamba-num-groups 8 "
            "--hidden-dropout 0 --micro-batch-size 4 --global-batch-size 32 --hybrid-layer-pattern M*M-M*M- "
            "--tensor-model-parallel-size 2")
    budget = 3 * GiB
    verdict = evaluate(text, world_size=8, budget=budget, suggest=True)
    assert verdict.estimate is not None and verdict.estimate.fits is False
    suggestions = verdict.suggestions
    assert suggestions is not None and suggestions.suggestions
    for s in suggestions.suggestions:     # each re-estimated through api.evaluate with its flags
        assert s.estimate.fits is True and s.device_peak_bytes <= budget
        assert s.estimate.peak_stage.layer_kinds is not None
        again = evaluate(" ".join(shlex.quote(a) for a in _with_flags(argv(text), s)), world_size=8, budget=budget)
        assert again.estimate.peak_stage.device_peak_bytes == s.device_peak_bytes


def _with_flags(tokens: list[str], suggestion) -> list[str]:
    from megatron_estimator.planner.candidates import candidate_argv

    class _Flags:
        flags, remove_flags = suggestion.flags, suggestion.remove_flags
    return candidate_argv(tokens, _Flags, "main")


def test_a_pipe_free_split_is_noted_with_its_pipes():
    # arguments.py deprecates pp > 1 without '|' (select_pipeline_segment's backward-compatible
    # path): the plan says so, with the split written as '|' segments (MTP depths kept after '/').
    from types import SimpleNamespace

    from megatron_estimator.planner.hybrid import pipe_free_note

    stages = [SimpleNamespace(layers=(0, 1)), SimpleNamespace(layers=(2, 3)), SimpleNamespace(layers=(4, 5))]
    note = pipe_free_note({"hybrid_pattern_unified": "M*-M*-/M-/M-"}, stages)
    assert note.endswith("--hybrid-layer-pattern 'M*|-M|*-/M-/M-'")
    assert pipe_free_note({"hybrid_pattern_unified": "M*-|M*-"}, stages[:2]) is None
    assert pipe_free_note({"hybrid_pattern_unified": "M*-M*-"}, [SimpleNamespace(layers=tuple(range(6)))]) is None


def test_a_pattern_with_pipes_is_not_noted_as_failing_on_one_pipeline_rank():
    # 4 segments on pp 1 derive 4 virtual stages, which need pp > 1: no layout of the pattern has pp 1.
    plan = api.plan(argv(toy("M*|M-|M*|M-")), world_size=4, global_batch_size=16, budget=8 * GiB, top=1,
                    space=SMALL_SPACE, environ={})
    assert dict(plan.rejections)["vpp-needs-pipeline"] > 0
    assert not any("default layout" in note for note in plan.notes)


def test_the_proxy_counts_a_hybrids_communication_by_layer_kind():
    # "M*-E" with tp 2, cp 2, dp 1 on 4 GPUs, gbs 16 of 32 tokens: each GPU passes 16 x 16 tokens of
    # its 16-token shard per step, X = 256 tokens x h 64 x 2 bytes.  TP: 3 blocks (M, *, -) of
    # 4 (t-1)/t X each, the MoE layer only its etp (= tp 2) term, top-2 the tokens.  CP: the ring in
    # the attention layer, 3 (cp-1) K+V bytes of 2 x 4 heads x 16 / tp; the Mamba layer's
    # all-to-alls, 2 (cp-1)/cp x tokens x (zxBCdt 296 + d_inner 128) / tp x 2 bytes.
    # (no linear biases: expert tensor parallel 2 needs none, transformer_config.py a329dd6da5)
    plan = api.plan(argv(toy("M*-E", MOE + " --sequence-parallel --disable-bias-linear")), world_size=4, global_batch_size=16,
                    budget=8 * GiB, top=None, space=plan_records.SearchSpace(micro_batch_sizes=(1,),
                                                                               max_context_parallel=2),
                    environ={})
    [c] = [c for c in plan.candidates if (c.parallel.tp, c.parallel.cp, c.parallel.pp, c.parallel.ep,
                                          c.parallel.etp) == (2, 2, 1, 1, 2)
           and c.recompute.granularity is None and c.sequence_parallel and not c.distributed_optimizer]
    tokens = 16 * 16
    x = tokens * 64 * 2
    assert c.proxy.tp_bytes == int(3 * 4 * (2 - 1) / 2 * x + 1 * 4 * (2 - 1) / 2 * x * 2)
    kv = tokens * (2 * 4 * 16) * 2 / 2
    a2a = 2 * (2 - 1) / 2 * tokens * (2 * 128 + 2 * 2 * 8 + 8 + 128) / 2 * 2
    assert c.proxy.cp_bytes == int(1 * (2 - 1) * kv * 3 + a2a)


def test_plan_of_a_hybrid_entry_script_without_a_pattern_is_refused(tmp_path):
    from megatron_estimator.core.problems import InvalidInput

    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_hybrid.py --hidden-size 64 --num-attention-heads 4 --num-layers 4 "
                      "--seq-length 32 --max-position-embeddings 32 --vocab-size 1000 --micro-batch-size 1\n")
    with pytest.raises(InvalidInput) as err:
        api.plan(str(script), world_size=2, global_batch_size=4, budget=8 * GiB, environ={})
    assert [p.code for p in err.value.problems] == ["missing-hybrid-pattern"]


def test_no_re_split_pattern_for_a_release_without_hybrid_layer_pattern():
    # 0.16.1 has --hybrid-override-pattern only (no '|' segments): the planner proposes pipe-free
    # splits there, never a --hybrid-layer-pattern it would refuse.
    text = toy("M*M-M*M-").replace("--hybrid-layer-pattern", "--hybrid-override-pattern")
    big = ("--hidden-size 1024 --num-attention-heads 16 --seq-length 4096 --max-position-embeddings 4096 "
           "--vocab-size 1000 --bf16 --mamba-head-dim 64 --mamba-state-dim 16 --mamba-num-groups 8 "
           "--hidden-dropout 0 --micro-batch-size 4 --global-batch-size 32 --hybrid-override-pattern M*M-M*M- "
           "--tensor-model-parallel-size 2")
    layouts = _layouts(text, 4, SMALL_SPACE, release="0.16.1")
    assert layouts and not any(layout.get("hybrid_layer_pattern") for layout in layouts)
    verdict = evaluate(big, "0.16.1", world_size=8, budget=3 * GiB, suggest=True)
    assert verdict.estimate is not None and verdict.estimate.fits is False
    assert verdict.suggestions is not None and verdict.suggestions.suggestions
    assert all("--hybrid-layer-pattern" not in s.flags for s in verdict.suggestions.suggestions)
    # On main the same model may be re-split.
    assert any(layout.get("hybrid_layer_pattern") for layout in _layouts(text, 4, SMALL_SPACE))
