"""Hybrid (Mamba) models: the layer pattern, parameters per layer symbol and stage, Mamba
activations, and Megatron-LM's own examples/mamba/train.sh.  Every figure is itemised by hand
from the megatron-core modules; the parameter itemisation is also held to megatron-core's own
MambaModel (built with test-only kernel stubs, tests/mcore_hybrid_reference.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TREE_ENV, megatron_tree, problems_of

from megatron_estimator.model.activations import layer_activations
from megatron_estimator.model.parameters import count, layer_tensors

MAMBA_TRAIN = megatron_tree("examples/mamba/train.sh")

# A toy hybrid: h 64, a 4 (d 16), F 4h = 256, vocab 1000 -> 1024, 32 positions, LayerNorm, biases
# (Megatron's defaults), Mamba head dim 16, state 8, 2 groups -> d_inner 2h = 128, 8 heads.
TOY = ("--hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
       "--micro-batch-size 2 --vocab-size 1000 --bf16 --mamba-head-dim 16 --mamba-state-dim 8 "
       "--mamba-num-groups 2 --hidden-dropout 0 ")
H, F, VOCAB, POSITIONS = 64, 256, 1024, 32
D_INNER, HEADS, STATE, GROUPS, CONV = 128, 8, 8, 2, 4
MOE = "--num-experts 4 --moe-ffn-hidden-size 32 --moe-router-topk 2 "


def mamba_params(t: int, groups: int = GROUPS) -> int:
    """megatron/core/ssm/mamba_mixer.py MambaMixer.__init__ on one of t TP ranks, with the
    hybrid spec's TELayerNormColumnParallelLinear in_proj (its LayerNorm weight + bias, 2h)."""
    inner, heads, gs = D_INNER // t, HEADS // t, groups // t * STATE
    norm = 2 * H                                       # in_proj's fused LayerNorm (not split)
    in_proj = H * (2 * inner + 2 * gs + heads)         # z x B C dt, no bias
    conv = (inner + 2 * gs) * CONV + (inner + 2 * gs)  # conv1d weight [conv_dim, 1, 4] and bias
    ssm = 3 * heads                                    # dt_bias, A_log, D
    gated_norm = inner                                 # RMSNormGated weight
    out_proj = inner * H                               # row-parallel, no bias
    return norm + in_proj + conv + ssm + gated_norm + out_proj


def attention_params(t: int) -> int:
    # attention-only TransformerLayer: norm (2h), linear_qkv h -> 3h/t with bias, linear_proj h/t -> h + h bias
    return 2 * H + (H * 3 * H // t + 3 * H // t) + (H // t * H + H)


def mlp_params(t: int) -> int:
    # MLPLayer: norm fused into fc1 (2h), fc1 h -> F/t + bias, fc2 F/t -> h + bias h
    return 2 * H + (H * F // t + F // t) + (F // t * H + H)


def moe_params(ep: int = 1) -> int:
    # MoE layer: pre-MLP norm (2h), router E x h + E bias, E/ep experts fc1 h -> 32 (+32), fc2 32 -> h (+h)
    expert = (H * 32 + 32) + (32 * H + H)
    return 2 * H + (4 * H + 4) + 4 // ep * expert


def config(pattern: str, extra: str = "", world_size: int = 1):
    """The typed configuration of the toy with this pattern, its family told from the flags."""
    import shlex

    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.inputs.entry_script import model_family

    raw, problems = parse_megatron_argv(shlex.split(TOY + f"--hybrid-layer-pattern {pattern} " + extra))
    assert not problems, problems
    return resolve_config(raw, world_size=world_size, world_size_source="test", environ={},
                          family=model_family(raw))


def hybrid_estimate(pattern: str, extra: str = "", world_size: int = 1):
    from megatron_estimator.results.estimate import build_estimate

    cfg = config(pattern, extra, world_size)
    return cfg, build_estimate(cfg, environ={})


# -- the pattern -----------------------------------------------------------------------------

def test_the_layer_count_comes_from_the_pattern_and_overrides_num_layers():
    cfg, _ = hybrid_estimate("M*-E|M-M-/M-/M-", MOE + "--num-layers 99 --pipeline-model-parallel-size 2 "
                                 "--position-embedding-type rope", 2)
    assert cfg.model.num_layers == 8
    assert cfg.model.family == "hybrid"
    assert cfg.model.hybrid.layer_kinds == tuple("M*-EM-M-")
    assert cfg.model.hybrid.segments == (4, 4)
    assert (cfg.model.hybrid.mtp_kinds, cfg.model.mtp_num_layers) == (("M", "-"), 2)
    assert cfg.model.moe.layer_pattern == (False, False, False, True, False, False, False, False)


def test_the_deprecated_override_pattern_and_the_legacy_mtp_pattern():
    cfg, _ = hybrid_estimate("M*", "")
    assert cfg.model.num_layers == 2
    import shlex
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.entry_script import model_family

    raw, _ = parse_megatron_argv(shlex.split(TOY + "--hybrid-override-pattern M*M- --mtp-hybrid-override-pattern M- "
                                             "--mtp-num-layers 3 --position-embedding-type rope"))
    cfg = resolve_config(raw, world_size=1, world_size_source="test", environ={}, family=model_family(raw))
    assert cfg.model.num_layers == 4
    assert (cfg.model.hybrid.mtp_kinds, cfg.model.hybrid.mtp_depths, cfg.model.mtp_num_layers) == (("M", "-"), 3, 3)


@pytest.mark.parametrize("extra, code, location", [
    ("--hybrid-layer-pattern M*X", "invalid-hybrid-pattern", "--hybrid-layer-pattern"),
    ("--hybrid-layer-pattern M*/M-/MM", "invalid-hybrid-pattern", "--hybrid-layer-pattern"),
    ("--hybrid-layer-pattern M*+", "invalid-hybrid-pattern", "--hybrid-layer-pattern"),
    ("--hybrid-layer-pattern M*M --pipeline-model-parallel-size 2", "layers-not-divisible-by-pp", "--num-layers"),
    ("--hybrid-layer-pattern M*|M-|M- --pipeline-model-parallel-size 2", "hybrid-segments-vs-pp", "--hybrid-layer-pattern"),
    ("--hybrid-layer-pattern M*|M- --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1",
     "hybrid-pattern-conflict", "--decoder-first-pipeline-num-layers"),
    ("--hybrid-layer-pattern M*M- --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2",
     "hybrid-pattern-conflict", "--num-virtual-stages-per-pipeline-rank"),
    ("--hybrid-layer-pattern ME", "hybrid-moe-without-experts", "--hybrid-layer-pattern"),
    ("--hybrid-layer-pattern M- --tensor-model-parallel-size 4 --mamba-num-groups 2", "mamba-shape", "--mamba-num-groups"),
    ("--hybrid-layer-pattern M- --hybrid-override-pattern M-", "conflicting-hybrid-patterns", "--hybrid-override-pattern"),
])
def test_patterns_megatron_rejects(extra, code, location):
    found = problems_of(TOY + extra, world_size=None)
    assert (code, location) in [(p.code, p.location) for p in found], found


def test_a_hybrid_entry_script_without_a_pattern_is_refused_not_estimated_as_gpt(tmp_path):
    from megatron_estimator import api

    inp, problems, _ = api.input_from_launch(["torchrun", "--nproc-per-node", "1", "pretrain_hybrid.py", "--num-layers", "4"]
                                             + TOY.split(), environ={"PWD": str(tmp_path)})
    verdict = api.evaluate(inp, problems=problems, environ={})
    assert verdict.estimate is None
    assert [p.code for p in verdict.problems] == ["missing-hybrid-pattern"]


# -- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("symbol", ["M", "*", "-", "E"])
def test_each_layer_symbol_counted_by_hand(symbol, t):
    # expert TP 1: MoE layers with biases refuse any other (transformer_config.py __post_init__)
    extra = MOE + f"--tensor-model-parallel-size {t} --expert-tensor-parallel-size 1 --mamba-num-groups 4 " \
        + ("--sequence-parallel" if t > 1 else "")
    cfg = config("M*-E", extra, world_size=t)
    index = "M*-E".index(symbol)
    # 4 Mamba groups, so that tp 4 divides them
    expected = {"M": mamba_params(t, groups=4), "*": attention_params(t), "-": mlp_params(t), "E": None}[symbol]
    if symbol == "E":
        # router, norm and experts are not split by tp (etp 1 leaves the experts' ffn whole)
        e = 1
        expert = (H * 32 // e + 32 // e) + (32 // e * H + H)
        expected = 2 * H + (4 * H + 4) + 4 * expert
    assert count(layer_tensors(cfg, index, "")).total == expected


def test_mla_layers_fuse_the_q_kv_norms_into_the_up_projections_with_qk_layernorm():
    extra = "--q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 8 --v-head-dim 8 --qk-layernorm "
    cfg = config("M+", extra)
    # MLA-only TransformerLayer (hybrid_layer_specs.py mla_layer: q_layernorm / kv_layernorm
    # IdentityOp, so mla_qk_norm_config.py makes linear_q_up_proj / linear_kv_up_proj fused
    # LayerNorm + linear): input norm 2h; q down h -> 32, q up's LayerNorm 2 x 32, q up
    # 32 -> 4 x 16; kv down h -> 16 + 8; kv up's LayerNorm 2 x 16, kv up 16 -> 4 x (8 + 8);
    # out 4 x 8 -> h with bias h.  (tests/test_mla_norms.py covers the other cases.)
    expected = 2 * H + H * 32 + 2 * 32 + 32 * 4 * 16 + H * 24 + 2 * 16 + 16 * 4 * 16 + (4 * 8 * H + H)
    assert count(layer_tensors(cfg, 1, "")).total == expected


def test_a_toy_hybrid_model_per_stage_with_a_pipeline_split_and_mtp():
    cfg, est = hybrid_estimate("M*|M-/M-", "--pipeline-model-parallel-size 2 --position-embedding-type rope", 2)
    embedding = VOCAB * H
    final_norm = 2 * H
    # MTP layer (multi_token_prediction.py): enorm, hnorm (2h each), eh_proj 2h -> h, the pattern's
    # M and - layers, its final layernorm; it runs on the last stage, which holds the embedding too.
    mtp = 2 * H + 2 * H + 2 * H * H + mamba_params(1) + mlp_params(1) + 2 * H
    first = embedding + mamba_params(1) + attention_params(1)
    last = mamba_params(1) + mlp_params(1) + final_norm + mtp + embedding + embedding   # + the output layer
    assert [s.parameters for s in est.stages] == [first, last]
    assert [s.layer_kinds for s in est.stages] == ["M*", "M-/M-"]
    # One model copy: the embedding once, the output layer tied (not counted again).
    assert est.total_parameters == embedding + 2 * mamba_params(1) + attention_params(1) + mlp_params(1) \
        + final_norm + mtp


def test_pipe_free_patterns_split_evenly_and_more_segments_interleave():
    _, est = hybrid_estimate("M*M-", "--pipeline-model-parallel-size 2", 2)
    assert [s.layer_indices for s in est.stages] == [(0, 1), (2, 3)]
    cfg, est = hybrid_estimate("M|*|M|-", "--pipeline-model-parallel-size 2 --global-batch-size 4", 2)
    assert cfg.parallel.vpp == 2
    # segment vp * pp + rank: rank 0 runs segments 0 and 2, rank 1 segments 1 and 3
    assert [s.layer_indices for s in est.stages] == [(0, 2), (1, 3)]
    assert [s.layer_kinds for s in est.stages] == ["M|M", "*|-"]


# -- activations -----------------------------------------------------------------------------

def mamba_layer_bytes(t: int, sp: bool, tokens: int) -> int:
    """One Mamba layer per microbatch, bf16, LayerNorm: see model/activations.py for the sources."""
    tokens_r = tokens // t if sp else tokens
    inner, heads, gs = D_INNER // t, HEADS // t, GROUPS // t
    norm = 2 * tokens_r * H + 2 * tokens_r * H + 8 * tokens_r        # input, normalized output, mu + rsigma
    zxbcdt = 2 * tokens * (2 * inner + 2 * gs * STATE + heads)       # MambaSplitConv1dScanCombinedFn saves it
    out_x = 2 * tokens * inner                                       # ... and the pre-gate scan output
    gated_norm = 2 * tokens * inner + 4 * tokens * gs                # RMSNormGated: input, fp32 rstd per group
    out_proj = 2 * tokens * inner                                    # out_proj's saved input
    return norm + zxbcdt + out_x + gated_norm + out_proj


@pytest.mark.parametrize("t, sp", [(1, False), (2, False), (2, True)])
def test_mamba_layer_activations_by_hand(t, sp):
    extra = f"--tensor-model-parallel-size {t} " + ("--sequence-parallel " if sp else "")
    cfg = config("M-", extra, world_size=t)
    assert layer_activations(cfg, 0).total == mamba_layer_bytes(t, sp, 32 * 2)


def test_mamba_layers_keep_their_input_only_under_full_recompute():
    cfg, est = hybrid_estimate("MM", "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    from megatron_estimator.model.stage import chunk_activation_bytes
    from megatron_estimator.model.layout import pipeline_stages

    [stage] = pipeline_stages(cfg)
    chunk = chunk_activation_bytes(cfg, stage.chunks[0])
    assert chunk.recompute_peak == mamba_layer_bytes(1, False, 64)


def test_toy_parameters_equal_megatron_cores_mamba_model():
    # The hand itemisation above against megatron-core's own MambaModel (tests/mcore_hybrid_reference.py:
    # meta device, test-only stubs of the kernel packages); more shapes in tests/test_mcore_crosscheck.py.
    hybrid_reference = pytest.importorskip("mcore_hybrid_reference")
    ok, why = hybrid_reference.mamba_available()
    if not ok:
        pytest.skip(f"megatron-core's MambaModel cannot be built here: {why}")
    spec = {"hybrid_override_pattern": "M*-M", "hidden_size": H, "num_attention_heads": 4, "ffn_hidden_size": F,
            "vocab_size": 1000, "max_position_embeddings": POSITIONS, "mamba_head_dim": 16, "mamba_state_dim": STATE,
            "mamba_num_groups": GROUPS, "position_embedding_type": "none"}
    for t in (1, 2):
        # tied embedding (padded 1024 rows, t-split) + final LayerNorm (2h)
        by_hand = 2 * mamba_params(t) + attention_params(t) + mlp_params(t) + VOCAB // t * H + 2 * H
        assert hybrid_reference.reference_hybrid_parameter_counts({**spec, "tensor_model_parallel_size": t}) == [by_hand]


# -- Megatron-LM's own example -----------------------------------------------------------------

def _cli(args, cwd):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    environ["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "megatron_estimator"] + args, capture_output=True, text=True,
                          env=environ, cwd=cwd, timeout=120)


@pytest.mark.skipif(MAMBA_TRAIN is None, reason=f"set {TREE_ENV} to a Megatron-LM checkout (its examples/ are not ours to commit)")
def test_megatron_lms_mamba_train_sh(tmp_path):
    example = MAMBA_TRAIN / "examples/mamba/train.sh"
    script = example.read_text()
    # As written, only its SentencePiece tokenizer file (argument 2) is missing here.
    result = _cli(["check", "--format", "json", "--script-arg=/data", "--script-arg=/tok.model",
                   str(example)], tmp_path)
    doc = json.loads(result.stdout)
    assert [p["code"] for p in doc["problems"]] == ["unknown-vocab-size"], doc["problems"]
    # With a vocabulary size it is estimated: 800M (the script's default scale).
    copy = tmp_path / "train.sh"
    copy.write_text(script.replace("--tokenizer-type GPTSentencePieceTokenizer",
                                   "--tokenizer-type NullTokenizer --vocab-size 131072"))
    result = _cli(["check", "--format", "json", "--script-arg=/data", "--script-arg=/tok", str(copy)], tmp_path)
    doc = json.loads(result.stdout)
    assert doc["problems"] == [], doc["problems"]
    pattern = "M-M-M--M-*M-M-M-M--*M-M-M-M-*M--M-M-M-*M-M--M-M-"
    [stage] = doc["stages"]
    assert stage["layer_kinds"] == pattern
    # By hand: h 1024, 16 heads, 8 query groups (d 64), F 4h (gelu), RMSNorm, no biases, untied,
    # no position embedding, Mamba d_inner 2048, 32 heads of 64, 8 groups, state 128; tp 1.
    h, f, d, g, a = 1024, 4096, 64, 8, 16
    vocab = 131072          # NullTokenizer on main (0.18.0 on) adds no end-of-document token
    mamba = h + h * (2 * 2048 + 2 * 8 * 128 + 32) + (2048 + 2 * 8 * 128) * 5 + 3 * 32 + 2048 + 2048 * h
    attention = h + h * (a + 2 * g) * d + a * d * h
    mlp = h + h * f + f * h
    layers = pattern.count("M") * mamba + pattern.count("*") * attention + pattern.count("-") * mlp
    assert doc["total_parameters"] == layers + 2 * vocab * h + h
    assert re.search(r"hybrid", doc["model"]["family"])


def test_the_report_states_the_mamba_kernel_assumption_only_when_there_are_mamba_layers():
    from megatron_estimator.report.assumptions import state_all

    _, with_mamba = hybrid_estimate("M*M-")
    stated = [a.text for a in state_all(with_mamba.assumed) if a.key == "mamba_kernels"]
    assert len(stated) == 1 and stated[0].startswith("Mamba layers (2): ") and "mamba_ssm" in stated[0]
    _, without = hybrid_estimate("*-*-")
    assert not [a for a in without.assumed if a.code == "mamba_kernels"]


@pytest.mark.parametrize("spec, assumed", [
    ("megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec", False),
    ("megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec", False),
    ("my_specs custom_stack_spec", True),
])
def test_the_standard_hybrid_stack_spec_is_what_the_model_counts(spec, assumed):
    cfg, _ = hybrid_estimate("M*M-", f"--spec {spec}")
    assert ("--spec" in [flag for flag, _ in cfg.not_modelled]) is assumed
