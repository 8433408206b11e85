"""Checks of the megatron-core reference harness itself (tests/mcore_reference.py).

Parameter counts: the published sizes of four models, exact per-rank counts of small
TP/PP/EP builds (worked out by hand below), and that the per-rank shards of a parallel build
add back up to the unsharded model.  Saved activations: exact per-layer bytes of small
GPT- and LLaMA-style layers against closed forms, itemised per saved tensor.

Skipped, with the reason, where torch / megatron-core cannot be imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _missing_module():
    for name in ("torch", "megatron.core"):
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


if _missing_module() is not None:
    pytest.skip(f"megatron-core reference checks need torch and megatron-core "
                f"({_missing_module()} is not installed; it is a test-only dependency)",
                allow_module_level=True)

import mcore_reference as ref  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _megatron_importable():
    available, reason = ref.megatron_core_available()
    if not available:
        pytest.skip(reason)


# --------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(ref.PUBLISHED_MODELS))
def test_published_parameter_counts(key):
    model = ref.PUBLISHED_MODELS[key]
    stages = ref.reference_parameter_counts(model.spec)
    assert len(stages) == 1
    assert stages[0].total == model.parameters
    assert stages[0].te_total == model.parameters          # TP = 1: nothing is replicated
    assert sum(stages[0].by_prefix.values()) == model.parameters


def test_llama3_8b_breakdown():
    stage = ref.reference_parameter_counts(ref.PUBLISHED_MODELS["llama3-8b"].spec)[0]
    h, v, f, layers = 4096, 128256, 14336, 32
    per_layer = h * (32 + 2 * 8) * 128 + 32 * 128 * h + 3 * h * f + 2 * h
    assert dict(stage.by_prefix) == {
        "embedding": v * h,
        "decoder.layers": layers * per_layer,
        "decoder.final_layernorm": h,
        "output_layer": v * h,
    }
    assert stage.layer_numbers == tuple(range(1, 33))


# A small GPT: h=64, a=4 (d=16), F=128, V=256, 32 learned positions, 4 layers, LayerNorm,
# GeLU, biases, tied embeddings.  Per layer, unsharded: qkv 64*192 + 192, proj 64*64 + 64,
# fc1 64*128 + 128, fc2 128*64 + 64, two LayerNorms 4*64.
SMALL_GPT = dict(num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                 padded_vocab_size=256, max_position_embeddings=32)

# A small MoE model: layer 1 dense, layers 2-4 MoE with 4 experts of width 32, top-2, a
# shared expert of width 64; SwiGLU, RMSNorm, no biases, untied, RoPE.
SMALL_MOE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                 padded_vocab_size=256, position_embedding_type="rope", normalization="RMSNorm",
                 swiglu=True, add_bias_linear=False, untie_embeddings_and_output_weights=True,
                 num_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2,
                 moe_shared_expert_intermediate_size=64, moe_layer_freq="[0]+[1]*3")


def test_small_gpt_tp2_pp2_exact_counts():
    stages = ref.reference_parameter_counts(
        {**SMALL_GPT, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2})
    # per layer on one TP rank: qkv 6144 + 96, proj 2048 + 64 (row-parallel bias whole),
    # fc1 4096 + 64, fc2 4096 + 64, LayerNorms 256
    per_layer = 6240 + 2112 + 4160 + 4160 + 256
    first, last = stages
    assert (first.pipeline_rank, last.pipeline_rank) == (0, 1)
    assert first.layer_numbers == (1, 2) and last.layer_numbers == (3, 4)
    # word embeddings 128 x 64 per TP rank, positions 32 x 64 on every rank
    assert dict(first.by_prefix) == {"embedding": 128 * 64 + 32 * 64,
                                     "decoder.layers": 2 * per_layer}
    # tied embeddings with PP > 1: the last stage holds its own copy as output_layer.weight
    assert dict(last.by_prefix) == {"decoder.layers": 2 * per_layer,
                                    "decoder.final_layernorm": 128,
                                    "output_layer": 128 * 64}
    assert (first.total, last.total) == (44096, 42176)


def test_small_moe_tp2_ep2_etp1_pp2_exact_counts():
    stages = ref.reference_parameter_counts(
        {**SMALL_MOE, "tensor_model_parallel_size": 2, "expert_model_parallel_size": 2,
         "expert_tensor_parallel_size": 1, "pipeline_model_parallel_size": 2})
    # dense layer / TP rank: qkv 64*192/2, proj 64*64/2, fc1 64*256/2, fc2 128*64/2, 2 norms
    dense = 6144 + 2048 + 8192 + 4096 + 128
    # MoE layer: attention 8192, norms 128, router 4*64, 2 local experts of
    # (64*64 + 32*64) unsplit (ETP 1), shared expert (64*128 + 64*64)/2
    experts = 2 * (64 * 64 + 32 * 64)
    moe = 8192 + 128 + 256 + experts + 6144
    first, last = stages
    assert first.total == 128 * 64 + dense + moe == 55808
    assert last.total == 2 * moe + 64 + 128 * 64 == 62272
    assert (first.expert_total, last.expert_total) == (experts, 2 * experts)


def _expected_split(name: str, expert: bool, tp: int, etp: int) -> int:
    """How many ways megatron splits a tensor over TP (or ETP for routed experts)."""
    if expert:
        return etp if not name.endswith("linear_fc2.bias") else 1
    replicated = ("layernorm", "norm.", ".router.", "position_embeddings",
                  "linear_proj.bias", "linear_fc2.bias")
    return 1 if any(part in name for part in replicated) else tp


@pytest.mark.parametrize("spec,tp,pp,ep,etp", [
    (SMALL_GPT, 2, 2, 1, 2),
    (SMALL_MOE, 2, 2, 2, 1),
    (SMALL_MOE, 2, 4, 4, 2),
])
def test_parallel_shards_add_up_to_the_unsharded_model(spec, tp, pp, ep, etp):
    full_stage = ref.reference_parameter_counts(spec)[0]
    full = {t.name: t.numel for t in full_stage.tensors}
    stages = ref.reference_parameter_counts(
        {**spec, "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
         "expert_model_parallel_size": ep, "expert_tensor_parallel_size": etp})
    assert [s.pipeline_rank for s in stages] == list(range(pp))
    experts = spec.get("num_experts") or 0
    covered: Counter = Counter()
    rebuilt = 0
    for stage in stages:
        for t in stage.tensors:
            if t.name == "output_layer.weight" and "output_layer.weight" not in full:
                # tied embeddings: the last stage's copy of the word embeddings
                assert t.numel == full["embedding.word_embeddings.weight"] // tp
                continue
            split = _expected_split(t.name, t.expert, tp, etp)
            assert full[t.name] == t.numel * split, t.name
            if t.expert:   # local expert j on EP rank 0 stands for j + r * E / ep on rank r
                head, tail = t.name.split(".local_experts.")
                j, rest = tail.split(".", 1)
                for r in range(ep):
                    covered[f"{head}.local_experts.{int(j) + r * experts // ep}.{rest}"] += 1
                rebuilt += t.numel * split * ep
            else:
                covered[t.name] += 1
                rebuilt += t.numel * split
    assert set(covered) == set(full) and set(covered.values()) == {1}
    assert rebuilt == full_stage.total


def test_virtual_stages_and_layout_place_layers():
    vpp = ref.reference_parameter_counts(
        {**SMALL_GPT, "pipeline_model_parallel_size": 2, "num_virtual_stages_per_pipeline_rank": 2})
    assert [(s.pipeline_rank, s.virtual_stage, s.layer_numbers) for s in vpp] == [
        (0, 0, (1,)), (0, 1, (3,)), (1, 0, (2,)), (1, 1, (4,))]
    assert "embedding" in vpp[0].by_prefix and "output_layer" in vpp[3].by_prefix
    layout = ref.reference_parameter_counts(
        {**SMALL_GPT, "pipeline_model_parallel_size": 2,
         "pipeline_model_parallel_layout": "Ett|t|t|L"})
    assert [(s.pipeline_rank, s.virtual_stage, s.layer_numbers) for s in layout] == [
        (0, 0, (1, 2)), (0, 1, (4,)), (1, 0, (3,)), (1, 1, ())]
    assert dict(layout[3].by_prefix) == {"decoder.final_layernorm": 128, "output_layer": 256 * 64}


def test_uneven_first_and_last_stages():
    stages = ref.reference_parameter_counts(
        {**SMALL_GPT, "num_layers": 6, "pipeline_model_parallel_size": 3,
         "decoder_first_pipeline_num_layers": 1, "decoder_last_pipeline_num_layers": 1})
    assert [s.layer_numbers for s in stages] == [(1,), (2, 3, 4, 5), (6,)]


def test_te_spec_replicates_mla_down_projections():
    mla = {**SMALL_MOE, "multi_latent_attention": True, "q_lora_rank": 32, "kv_lora_rank": 16,
           "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16, "qk_layernorm": True}
    (tp1,) = ref.reference_parameter_counts(mla)
    assert tp1.te_total == tp1.total
    (tp2,) = ref.reference_parameter_counts({**mla, "tensor_model_parallel_size": 2})
    # local spec: q_down (64 x 32) and kv_down (64 x 24) split over TP; TE: whole on each rank
    assert tp2.te_total - tp2.total == 4 * (64 * 32 + 64 * 24) // 2
    down = [t for t in tp2.tensors if "down_proj" in t.name]
    assert len(down) == 8 and all(t.te_numel == 2 * t.numel for t in down)


def test_mtp_lives_on_the_last_stage_with_an_embedding():
    stages = ref.reference_parameter_counts(
        {**SMALL_MOE, "mtp_num_layers": 1, "pipeline_model_parallel_size": 2})
    first, last = stages
    assert (first.mtp_layers, last.mtp_layers) == (0, 1)
    # the MTP stage builds its own word embeddings next to the output layer
    assert last.by_prefix["embedding"] == 256 * 64 and last.by_prefix["output_layer"] == 256 * 64
    # MTP layer: enorm + hnorm + eh_proj (128 -> 64) + a MoE transformer layer + final norm
    moe_layer = 8192 * 2 + 128 + 256 + 4 * (64 * 64 + 32 * 64) + 2 * 6144
    assert last.by_prefix["mtp"] == 64 + 64 + 128 * 64 + moe_layer + 64


def test_bad_specs_are_rejected():
    with pytest.raises(ref.SpecError, match="unknown spec keys: hiden_size"):
        ref.reference_parameter_counts({**SMALL_GPT, "hiden_size": 64})
    with pytest.raises(ref.SpecError, match="missing required spec keys: num_attention_heads"):
        ref.reference_parameter_counts({"num_layers": 2, "hidden_size": 64,
                                        "padded_vocab_size": 256, "max_position_embeddings": 8})
    with pytest.raises(ref.SpecError, match="megatron-core rejects"):
        ref.reference_parameter_counts({**SMALL_GPT, "pipeline_model_parallel_size": 3})


def test_vocab_is_padded_like_megatron():
    (stage,) = ref.reference_parameter_counts(
        {**{k: v for k, v in SMALL_GPT.items() if k != "padded_vocab_size"},
         "vocab_size": 50257, "tensor_model_parallel_size": 2})
    # ceil(50257 / (128 * 2)) * 256 = 50432 rows, half per TP rank
    assert "output_layer" not in stage.by_prefix     # tied, one stage: no second copy
    word = next(t for t in stage.tensors if t.name == "embedding.word_embeddings.weight")
    assert word.shape == (50432 // 2, 64)


# --------------------------------------------------------------------------------------
# Saved activations (s=128, b=2, h=256, a=8; bf16)
# --------------------------------------------------------------------------------------

S, B, H, A = 128, 2, 256, 8
SBH, SB = S * B * H, S * B
AS2B = A * S * S * B

GPT = dict(num_layers=2, hidden_size=H, num_attention_heads=A, ffn_hidden_size=4 * H,
           padded_vocab_size=512, max_position_embeddings=S)
LLAMA = dict(num_layers=2, hidden_size=H, num_attention_heads=A, num_query_groups=4,
             ffn_hidden_size=704, padded_vocab_size=512, position_embedding_type="rope",
             normalization="RMSNorm", swiglu=True, add_bias_linear=False,
             untie_embeddings_and_output_weights=True, hidden_dropout=0.0, attention_dropout=0.0)


def _items(measurement, layer=1):
    return Counter((t.dtype, t.nbytes) for t in measurement.layer_tensors(layer))


def _expected(*entries):
    total: Counter = Counter()
    for key, count in entries:
        total[key] += count
    return total


def test_gpt_layer_matches_korthikanti_plus_layernorm_statistics():
    m = ref.saved_activation_bytes(GPT, S, B, "bf16", kernels="gpu")
    f = 4 * H
    # sbh(34 + 5as/h) (Korthikanti et al.) + fp32 mean and rstd of two LayerNorms
    assert m.layer_bytes(0) == m.layer_bytes(1) == 34 * SBH + 5 * AS2B + 16 * SB
    assert _items(m) == _expected(
        (("bfloat16", 2 * SBH), 5),        # LN1 in, QKV in, proj in, LN2 in, fc1 in
        (("bfloat16", 6 * SBH), 1),        # the QKV output: q, k, v are views of it
        (("float32", 4 * SB), 4),          # LayerNorm mean + rstd, twice
        (("bfloat16", 2 * AS2B), 2),       # softmax probs, dropped probs (bmm input)
        (("bool", AS2B), 1),               # attention dropout mask
        (("bool", SBH), 2),                # two bias-dropout-add masks
        (("bfloat16", 2 * S * B * f), 2),  # GeLU input, fc2 input
    )
    assert m.group_bytes("shared") == 0    # the fused causal softmax does not read the mask
    assert m.group_bytes("embedding") == 8 * SB + 8 * SB + SBH    # ids, positions, mask
    assert m.group_bytes("final_layernorm") == 2 * SBH + 8 * SB
    assert m.group_bytes("output_layer") == 2 * SBH
    # vocab-parallel cross entropy: fp32 softmax, target mask, masked targets
    assert m.group_bytes("loss") == 4 * SB * 512 + SB + 8 * SB


def test_gpt_layer_on_cpu_kernels():
    m = ref.saved_activation_bytes(GPT, S, B, "bf16", kernels="cpu")
    # dropout saves a bf16 noise tensor (not a bool mask), LayerNorm statistics are bf16,
    # and the torch softmax path saves the causal mask (once, shared by all layers)
    assert m.layer_bytes(1) == 36 * SBH + 6 * AS2B + 8 * SB
    assert m.group_bytes("shared") == S * S


def test_llama_layer_with_gqa():
    m = ref.saved_activation_bytes(LLAMA, S, B, "bf16", kernels="gpu")
    f = 704
    assert m.layer_bytes(1) == 16 * SBH + 2 * AS2B + 6 * S * B * f + 8 * SB
    assert _items(m) == _expected(
        (("bfloat16", 2 * SBH), 8),        # norms in, QKV in, q, k and v repeated to 8
                                           # heads, proj in, fc1 in
        (("float32", 4 * SB), 2),          # RMSNorm rstd
        (("bfloat16", 2 * AS2B), 1),       # softmax probs (no dropout)
        (("bfloat16", 4 * S * B * f), 1),  # fc1 output (SwiGLU input)
        (("bfloat16", 2 * S * B * f), 1),  # fc2 input
    )
    # fused RoPE keeps one fp32 freqs table [s, 1, 1, d] for all layers
    assert m.group_bytes("shared") == 4 * S * (H // A)


def test_gpu_kernel_emulation_computes_the_same_forward():
    gpu = ref.saved_activation_bytes(LLAMA, S, B, "bf16", kernels="gpu")
    cpu = ref.saved_activation_bytes(LLAMA, S, B, "bf16", kernels="cpu")
    # same weights and data, no dropout: only bf16 rounding inside the kernels differs
    assert gpu.loss == pytest.approx(cpu.loss, rel=2e-3)
    assert 5.0 < gpu.loss < 8.0          # about ln(512) for an untrained model


def test_llama_layer_without_gqa_keeps_the_qkv_buffer():
    m = ref.saved_activation_bytes({**LLAMA, "num_query_groups": None}, S, B, "bf16")
    # q and k are new tensors after RoPE; v is a view of the whole QKV output
    assert m.layer_bytes(1) == 20 * SBH + 2 * AS2B + 6 * S * B * 704 + 8 * SB


def test_llama_layer_on_cpu_kernels():
    m = ref.saved_activation_bytes(LLAMA, S, B, "bf16", kernels="cpu")
    d = H // A
    # composite RMSNorm adds fp32 input and output copies (6sbh more per norm); unfused
    # RoPE saves bf16 cos and sin for q and for k in every layer
    assert m.layer_bytes(1) == 28 * SBH + 2 * AS2B + 6 * S * B * 704 + 8 * SB + 8 * S * d
    assert m.group_bytes("shared") == S * S       # the causal mask


def test_unfused_swiglu_costs_ten_sbf():
    m = ref.saved_activation_bytes({**LLAMA, "bias_swiglu_fusion": False}, S, B, "bf16")
    assert m.layer_bytes(1) == 16 * SBH + 2 * AS2B + 10 * S * B * 704 + 8 * SB


def test_selective_recompute_of_core_attention():
    gpt = ref.saved_activation_bytes({**GPT, "recompute_granularity": "selective"}, S, B)
    assert gpt.layer_bytes(1) == 34 * SBH + 16 * SB
    llama = ref.saved_activation_bytes({**LLAMA, "recompute_activations": True}, S, B)
    g = 4
    # q (2sbh), k after RoPE (2sbh g/a) and the QKV output that v views (2sbh (a+2g)/a)
    assert llama.layer_bytes(1) == (12 * SBH + 2 * SBH * g // A + 2 * SBH * (A + 2 * g) // A
                                    + 6 * S * B * 704 + 8 * SB)
    assert llama.group_bytes("shared") == 4 * S * (H // A) + S * S   # freqs, mask


def test_full_recompute_keeps_layer_inputs():
    uniform = ref.saved_activation_bytes(
        {**GPT, "recompute_granularity": "full", "recompute_method": "uniform",
         "recompute_num_layers": 1}, S, B)
    assert uniform.layer_bytes(0) == uniform.layer_bytes(1) == 2 * SBH
    block = ref.saved_activation_bytes(
        {**LLAMA, "recompute_granularity": "full", "recompute_method": "block",
         "recompute_num_layers": 1}, S, B)
    assert block.layer_bytes(0) == 2 * SBH
    assert block.layer_bytes(1) == 16 * SBH + 2 * AS2B + 6 * S * B * 704 + 8 * SB


def test_tensor_and_sequence_parallel_shapes():
    t = 2
    tp = ref.saved_activation_bytes({**GPT, "tensor_model_parallel_size": t}, S, B)
    assert tp.layer_bytes(1) == SBH * (10 + 24 // t) + 5 * AS2B // t + 16 * SB
    sp = ref.saved_activation_bytes(
        {**GPT, "tensor_model_parallel_size": t, "sequence_parallel": True}, S, B)
    assert sp.layer_bytes(1) == 34 * SBH // t + 5 * AS2B // t + 16 * SB // t
    llama = ref.saved_activation_bytes(
        {**LLAMA, "tensor_model_parallel_size": t, "sequence_parallel": True}, S, B)
    assert llama.layer_bytes(1) == (16 * SBH + 2 * AS2B + 6 * S * B * 704 + 8 * SB) // t


MOE = {**LLAMA, "num_experts": 4, "moe_ffn_hidden_size": 128, "moe_router_topk": 2,
       "moe_layer_freq": 1}


def test_moe_layer_with_allgather_dispatcher():
    m = ref.saved_activation_bytes(MOE, S, B)
    k, e, f = 2, 4, 128
    attention = 14 * SBH + 2 * AS2B + 8 * SB
    # router input, permuted tokens, per-expert fc1 output + fc2 input, and routing
    # metadata: top-k indices (int64), top-k probs (fp32), permutation indices (int64),
    # permuted probs (bf16), routing map (bool E x sb) and its probs (bf16 E x sb)
    routed = 2 * SBH + 2 * SB * k * H + 6 * SB * k * f + 22 * SB * k + 3 * e * SB
    assert m.layer_bytes(0) == m.layer_bytes(1) == attention + routed
    shared = ref.saved_activation_bytes({**MOE, "moe_shared_expert_intermediate_size": 256}, S, B)
    # the shared expert reads the same normed input the router saved
    assert shared.layer_bytes(1) == attention + routed + 6 * SB * 256


def test_measurement_rejects_bad_arguments():
    with pytest.raises(ref.SpecError, match="kernels"):
        ref.saved_activation_bytes(GPT, S, B, kernels="tpu")
    with pytest.raises(ref.SpecError, match="dtype"):
        ref.saved_activation_bytes(GPT, S, B, dtype="fp8")
