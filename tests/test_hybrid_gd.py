"""Hybrid 'G' (gated delta net) and 'D' (DeepSeek sparse attention) layers: the rules Megatron
applies to them, their parameters per layer and stage with TP sharding, and what they keep for
backward.  Every figure is itemised here by hand from Megatron-LM main d98e8a64's modules
(megatron/core/ssm/gated_delta_net/, megatron/core/transformer/experimental_attention_variant/);
tests/test_hybrid_gd_mcore.py cross-checks the parameters against those modules built on the meta
device."""

from __future__ import annotations

import pytest

from conftest import problems_of
from test_hybrid import H, TOY, config, hybrid_estimate, mlp_params

from megatron_estimator.model.activations import layer_activations
from megatron_estimator.model.parameters import count, layer_tensors

# A toy gated delta net: 4 key heads, 8 value heads, both of dim 8, conv kernel 4 (the default).
HK, HV, DK, DV, CONV = 4, 8, 8, 8, 4
GDN = f"--linear-num-key-heads {HK} --linear-num-value-heads {HV} --linear-key-head-dim {DK} --linear-value-head-dim {DV} "
# A toy DSA: MLA q_lora 24, kv_lora 16, qk 8, rope 4, v 8; indexer 2 heads of 8, top-4; no biases.
Q_LORA, KV_LORA, QK, PE, V_HEAD = 24, 16, 8, 4, 8
IDX_HEADS, IDX_DIM, TOPK = 2, 8, 4
DSA = (f"--disable-bias-linear --q-lora-rank {Q_LORA} --kv-lora-rank {KV_LORA} --qk-head-dim {QK} "
       f"--qk-pos-emb-head-dim {PE} --v-head-dim {V_HEAD} --dsa-indexer-n-heads {IDX_HEADS} "
       f"--dsa-indexer-head-dim {IDX_DIM} --dsa-indexer-topk {TOPK} --position-embedding-type rope ")
A = 4                       # attention heads of the toy
SEQ, MBS = 32, 2


def tp(t: int) -> str:
    return f"--tensor-model-parallel-size {t} " + ("--sequence-parallel " if t > 1 else "")


# -- parameters ------------------------------------------------------------------------------

def gdn_params(t: int, variant: str = "gdn") -> int:
    """gated_delta_net/common.py _GDNBase.__init__ (+ gdn.py / gdn2.py _setup_variant_attrs) on one
    of t TP ranks, in the hybrid spec's gdn_layer (a TransformerLayer, no norm of its own)."""
    qk, v = HK * DK, HV * DV                         # 32, 64
    norm = 2 * H                                     # in_proj's fused LayerNorm, weight + bias, not split
    if variant == "gdn":
        in_proj = H * (2 * qk + 2 * v + 2 * HV) // t     # q k v z, beta and alpha per value head
        gates = HV // t + HV // t                        # dt_bias, A_log per value head
    else:
        in_proj = H * (2 * qk + 2 * v + 2 * qk + v) // t  # q k v z, f b per key channel, w per value channel
        gates = qk // t + HK // t                        # dt_bias per key channel, A_log per key head
    conv = (2 * qk + v) // t * CONV                  # depthwise conv1d over q k v, no bias
    out_norm = 2 * DV                                # TENorm over one value head (LayerNorm), replicated
    out_proj = v // t * H                            # row-parallel, no bias
    return norm + in_proj + conv + gates + out_norm + out_proj


def dsa_params(t: int, indexer: bool = True, qk_norm: bool = False) -> int:
    """absorbed_mla.py AbsorbedMLASelfAttention + dsa.py DSAttention / DSAIndexer on one of t TP
    ranks, in the hybrid spec's dsa_layer (TENorm input norm, TELinear duplicated down projections)."""
    q_head = QK + PE
    total = 2 * H                                    # input_layernorm (LayerNorm)
    total += H * Q_LORA                              # linear_q_down_proj, duplicated
    total += Q_LORA * A * q_head // t                # linear_q_up_proj, column-parallel
    total += H * (KV_LORA + PE)                      # linear_kv_down_proj, duplicated
    total += KV_LORA * A * (QK + V_HEAD) // t        # linear_kv_up_proj, column-parallel
    total += A * V_HEAD // t * H                     # linear_proj, row-parallel, no bias
    if qk_norm:
        total += 2 * Q_LORA + 2 * KV_LORA            # standalone q / kv LayerNorms
    if indexer:                                      # all duplicated on every TP rank
        total += Q_LORA * IDX_HEADS * IDX_DIM        # linear_wq_b
        total += H * IDX_DIM                         # linear_wk
        total += 2 * IDX_DIM                         # k_norm, always a LayerNorm
        total += H * IDX_HEADS                       # linear_weights_proj
    return total


@pytest.mark.parametrize("t, expected", [(1, 18080), (2, 9112), (4, 4628)])
def test_a_gated_delta_net_layer_counted_by_hand(t, expected):
    cfg = config("G-", GDN + tp(t), world_size=t)
    assert count(layer_tensors(cfg, 0, "")).total == gdn_params(t) == expected


@pytest.mark.parametrize("t, expected", [(1, 25268), (2, 12706)])
def test_a_gdn2_layer_counted_by_hand(t, expected):
    cfg = config("G-", GDN + tp(t) + "--experimental-attention-variant gdn2", world_size=t)
    assert cfg.model.hybrid.gdn.variant == "gdn2"
    assert count(layer_tensors(cfg, 0, "")).total == gdn_params(t, "gdn2") == expected


def test_gated_delta_net_tensors_and_their_sharding():
    cfg = config("G", GDN + tp(2), world_size=2)
    tensors = {p.name: p.numel for p in layer_tensors(cfg, 0, "")}
    assert tensors == {
        "self_attention.in_proj.layer_norm.weight": 64, "self_attention.in_proj.layer_norm.bias": 64,
        "self_attention.in_proj.weight": 64 * 104,          # (2*32 + 2*64 + 2*8) / 2 outputs
        "self_attention.conv1d.weight": 64 * 4,             # (2*32 + 64) / 2 channels x kernel 4
        "self_attention.dt_bias": 4, "self_attention.A_log": 4,
        "self_attention.out_norm.weight": 8, "self_attention.out_norm.bias": 8,
        "self_attention.out_proj.weight": 32 * 64,
    }


@pytest.mark.parametrize("t, expected", [(1, 8208), (2, 6096), (4, 5040)])
def test_a_dsa_layer_counted_by_hand(t, expected):
    cfg = config("D-", DSA + tp(t), world_size=t)
    assert count(layer_tensors(cfg, 0, "")).total == dsa_params(t) == expected


def test_dsa_qk_norms_exist_with_qk_layernorm():
    cfg = config("D-", DSA + "--qk-layernorm --experimental-attention-variant dsa")
    assert count(layer_tensors(cfg, 0, "")).total == dsa_params(1, qk_norm=True) == 8208 + 80


def test_only_layers_computing_their_top_k_hold_an_indexer():
    # --dsa-indexer-topk-freq 2 (offset 0 -> 1): layers 1, 3, 5 compute, 2 and 4 reuse 1's and 3's.
    cfg = config("DDDD-", DSA + "--dsa-indexer-topk-freq 2")
    counts = [count(layer_tensors(cfg, i, "")).total for i in range(4)]
    assert counts == [dsa_params(1), dsa_params(1, indexer=False)] * 2 == [8208, 7168, 8208, 7168]


def test_a_pipeline_split_with_g_and_d_layers():
    cfg, est = hybrid_estimate("G-D|DG-", GDN + DSA + "--pipeline-model-parallel-size 2", 2)
    embedding = 1024 * H                    # vocab 1000 padded to 1024, rope: no position table
    mlp = mlp_params(1) - 256 - H           # --disable-bias-linear: no fc1 / fc2 biases
    assert mlp == 32896
    first = embedding + gdn_params(1) + mlp + dsa_params(1)
    last = dsa_params(1) + gdn_params(1) + mlp + 2 * H + embedding      # final norm, output layer
    assert [s.parameters for s in est.stages] == [first, last] == [124720, 124848]
    assert [s.layer_kinds for s in est.stages] == ["G-D", "DG-"]


def test_g_and_d_layers_in_the_mtp_pattern():
    cfg, est = hybrid_estimate("G-/GD", GDN + DSA)
    # multi_token_prediction.py: enorm, hnorm, eh_proj 2h -> h, the nested stack's G and D layers, a final norm
    mtp = 2 * H + 2 * H + 2 * H * H + gdn_params(1) + dsa_params(1) + 2 * H
    embedding = 1024 * H
    mlp = mlp_params(1) - 256 - H
    assert [s.parameters for s in est.stages] == [embedding + gdn_params(1) + mlp + 2 * H + mtp]
    assert [s.layer_kinds for s in est.stages] == ["G-/GD"]


# -- rules -----------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, code, location", [
    ("G- " + GDN.replace(f"--linear-num-value-heads {HV}", "--linear-num-value-heads 6"),
     "gdn-shape", "--linear-num-value-heads"),
    ("G- " + GDN + "--tensor-model-parallel-size 8", "gdn-shape", "--linear-num-key-heads"),
    ("G- " + GDN + "--context-parallel-size 16", "gdn-shape", "--linear-num-value-heads"),
    ("G- " + GDN + "--experimental-attention-variant gdn", "gdn-needs-linear-attention-freq",
     "--experimental-attention-variant"),
    ("G- " + GDN + "--recompute-granularity selective --recompute-modules gdn_norm_out",
     "recompute-module-unsupported", "--recompute-modules"),
    ("D- " + DSA.replace(f"--dsa-indexer-topk {TOPK} ", ""), "dsa-shape", "--dsa-indexer-topk"),
    ("D- " + DSA.replace("--disable-bias-linear ", ""), "dsa-conflict", "--add-bias-linear"),
    ("D- " + DSA + "--tensor-model-parallel-size 2", "dsa-conflict", "--sequence-parallel"),
    ("D- " + DSA + "--context-parallel-size 2", "dsa-conflict", "--cp-comm-type"),
    ("D- " + DSA + "--dsa-indexer-head-dim 2", "dsa-shape", "--dsa-indexer-head-dim"),
    ("D- " + DSA + "--dsa-indexer-topk-freq 0", "dsa-shape", "--dsa-indexer-topk-freq"),
    ("D- " + DSA.replace(f"--q-lora-rank {Q_LORA} ", "") + "--qk-layernorm --experimental-attention-variant dsa",
     "dsa-conflict", "--qk-layernorm"),
    ("GD " + GDN + DSA + "--dsa-indexer-topk-freq 2", "dsa-topk-sharing", "--hybrid-layer-pattern"),
    ("D|D- " + DSA + "--dsa-indexer-topk-freq 2 --pipeline-model-parallel-size 2", "dsa-topk-sharing",
     "--hybrid-layer-pattern"),
    ("G/-D " + GDN + DSA + "--dsa-indexer-topk-freq 2", "dsa-topk-sharing", "--hybrid-layer-pattern"),
])
def test_what_megatron_refuses_for_g_and_d_layers(extra, code, location):
    found = problems_of(TOY + "--hybrid-layer-pattern " + extra, world_size=None)
    assert (code, location) in [(p.code, p.location) for p in found], found


@pytest.mark.parametrize("extra", [
    "G- " + GDN + "--experimental-attention-variant gdn2 --recompute-granularity selective "
                  "--recompute-modules gdn_norm_out",
    "G- " + GDN + "--tensor-model-parallel-size 4 --sequence-parallel",
    "D- " + DSA + "--tensor-model-parallel-size 2 --sequence-parallel",
    "D- " + DSA + "--context-parallel-size 2 --cp-comm-type allgather",
    "DDDD- " + DSA + "--dsa-indexer-topk-freq 2",
])
def test_what_megatron_accepts_for_g_and_d_layers(extra):
    assert problems_of(TOY + "--hybrid-layer-pattern " + extra, world_size=None) == []


# -- activations -----------------------------------------------------------------------------

def gdn_layer_bytes(t: int, sp: bool, norm_out_recompute: bool = False) -> int:
    """One 'G' layer per microbatch, bf16, LayerNorm, T = 32 x 2 tokens (model/activations.py notes)."""
    T = SEQ * MBS
    Tr = T // t if sp else T
    qk, v, hk, hv = HK * DK // t, HV * DV // t, HK // t, HV // t
    norm = 2 * Tr * H + 2 * Tr * H + 8 * Tr         # fused norm: input, normalized output, mu + rsigma
    in_proj = 2 * T * (2 * qk + 2 * v + 2 * hv)     # the whole in_proj output (views of it are saved)
    l2 = 2 * T * 2 * qk + 4 * T * 2 * hk            # L2-normalized q, k, fp32 rstd per head
    kernel = 2 * T * 2 * hv * DK + 2 * T * v        # q, k repeated to the value heads, v
    kernel += 4 * T * hv + 2 * T * hv               # fp32 g, beta
    kernel += 2 * T * hv * 64                       # A, chunk size 64
    norm_in = 2 * T * v + 2 * T * v                 # kernel output, gate z
    norm_rest = 0 if norm_out_recompute else 4 * T * hv + 2 * T * v    # rstd, out_proj's input
    return norm + in_proj + l2 + kernel + norm_in + norm_rest


def dsa_layer_bytes(t: int, recompute: str = "") -> int:
    """One 'D' layer per microbatch, bf16, LayerNorm, PyTorch sparse attention (tp > 1 with SP)."""
    T, b, s, skv = SEQ * MBS, MBS, SEQ, SEQ
    Tr = T // t
    n, L, P = A // t, KV_LORA, PE
    norm = 2 * Tr * H + (0 if recompute == "layernorm" else 2 * Tr * H) + 8 * Tr
    total = norm + 2 * Tr * Q_LORA                  # compressed q (linear_q_up_proj's input)
    total += 2 * T * n * (QK + PE)                  # up-projected Q (the absorption einsum's view)
    if recompute == "core_attn":
        total += 2 * T * n * (L + P) + 2 * T * (L + P)          # checkpointed query, key
    else:
        total += 4 * T * n * (L + P)                 # fp32 query
        total += 4 * b * n * (L + P) * skv           # fp32 key, expanded to every head by matmul
        total += (4 + 4 + 2 + 3) * b * n * s * skv   # exp, masked probs, bf16 probs, three bool masks
        total += (8 + 1 + 4 + 4) * b * n * s         # max index, where condition, row sum (clamp, div)
        total += 2 * b * n * skv * L                 # latent value, expanded to every head
        total += 2 * T * n * L + 2 * n * V_HEAD * L  # latent output, the V up weight's contiguous copy
    return total + 2 * T * n * V_HEAD               # linear_proj's input


@pytest.mark.parametrize("t, sp, expected", [(1, False, 173568), (2, False, None), (2, True, None), (4, True, None)])
def test_gated_delta_net_activations_by_hand(t, sp, expected):
    cfg = config("G-", GDN + f"--tensor-model-parallel-size {t} " + ("--sequence-parallel" if sp else ""),
                 world_size=t)
    assert layer_activations(cfg, 0).total == gdn_layer_bytes(t, sp)
    if expected is not None:
        assert gdn_layer_bytes(t, sp) == expected


def test_gdn_norm_out_recompute_keeps_the_norms_inputs_only():
    cfg = config("G-", GDN + "--experimental-attention-variant gdn2 --recompute-granularity selective "
                 "--recompute-modules gdn_norm_out")
    # gdn2's gates: fp32 g and b per key channel, w per value channel instead of g and beta per value head
    T, qk, v, hv = 64, HK * DK, HV * DV, HV
    gdn2_width = 2 * T * (2 * qk + 2 * v + 2 * qk + v) - 2 * T * (2 * qk + 2 * v + 2 * hv)
    gates = (4 * T * qk + 2 * T * qk + 2 * T * v) - (4 * T * hv + 2 * T * hv)
    assert layer_activations(cfg, 0).total == gdn_layer_bytes(1, False, norm_out_recompute=True) + gdn2_width + gates


@pytest.mark.parametrize("t, expected", [(1, 199424), (2, None), (4, None)])
def test_dsa_activations_by_hand(t, expected):
    cfg = config("D-", DSA + tp(t), world_size=t)
    assert layer_activations(cfg, 0).total == dsa_layer_bytes(t)
    if expected is not None:
        assert dsa_layer_bytes(t) == expected


@pytest.mark.parametrize("module", ["core_attn", "layernorm"])
def test_dsa_selective_recompute(module):
    cfg = config("D-", DSA + f"--recompute-granularity selective --recompute-modules {module}")
    assert layer_activations(cfg, 0).total == dsa_layer_bytes(1, module)


def test_dsa_with_a_fused_kernel_backend():
    cfg = config("D-", DSA + "--dsa-kernel-backend tilelang")
    T, b, n, L, P = 64, 2, A, KV_LORA, PE
    core = 2 * T * n * (L + P) + 2 * SEQ * b * (L + P) + 2 * T * n * L + 4 * T * n + 4 * T * TOPK + 2 * n * V_HEAD * L
    pytorch_core = dsa_layer_bytes(1) - dsa_layer_bytes(1, "core_attn") + 2 * T * n * (L + P) + 2 * T * (L + P)
    assert layer_activations(cfg, 0).total == dsa_layer_bytes(1) - pytorch_core + core


def test_dsa_scores_are_local_queries_by_all_keys_under_context_parallel():
    cfg = config("D-", DSA + "--context-parallel-size 2 --cp-comm-type allgather", world_size=2)
    # s = 16 local queries, 32 keys gathered: the s x s_kv terms halve, the fp32 key does not
    T, b, s, skv, n, L, P = 32, 2, 16, 32, A, KV_LORA, PE
    expected = (2 * T * H * 2 + 8 * T) + 2 * T * Q_LORA + 2 * T * n * (QK + PE)
    expected += 4 * T * n * (L + P) + 4 * b * n * (L + P) * skv + 13 * b * n * s * skv + 17 * b * n * s
    expected += 2 * b * n * skv * L + 2 * T * n * L + 2 * n * V_HEAD * L + 2 * T * n * V_HEAD
    assert layer_activations(cfg, 0).total == expected


def test_g_and_d_layers_keep_their_input_only_under_full_recompute():
    from megatron_estimator.model.layout import pipeline_stages
    from megatron_estimator.model.stage import chunk_activation_bytes

    cfg, _ = hybrid_estimate("GD", GDN + DSA + "--recompute-granularity full --recompute-method uniform "
                             "--recompute-num-layers 1")
    [stage] = pipeline_stages(cfg)
    chunk = chunk_activation_bytes(cfg, stage.chunks[0])
    # each layer's bf16 input, and the loss's: the final norm's input, output and statistics, fp32 logits
    loss = 2 * 64 * H + 2 * 64 * H + 8 * 64 + 4 * 64 * 1024
    assert chunk.kept == 2 * 2 * 64 * H + loss
    assert chunk.recompute_peak == max(gdn_layer_bytes(1, False), dsa_layer_bytes(1))


def test_the_report_names_the_kernel_assumptions():
    from megatron_estimator.report.assumptions import state_all

    _, est = hybrid_estimate("MGD-", GDN + DSA)
    keys = [a.key for a in state_all(est.assumed)]
    assert {"mamba_kernels", "gdn_kernels", "dsa_kernels"} <= set(keys)
    text = {a.key: a.text for a in state_all(est.assumed)}
    assert text["gdn_kernels"].startswith("gated delta net layers (1, gdn): ")
    assert "the size of the full scores" in text["dsa_kernels"]
    assert [s.layer_kinds for s in est.stages] == ["MGD-"]


def test_the_backward_working_set_of_g_and_d_layers():
    from megatron_estimator.model.stage import _layer_backward_working_set

    T = SEQ * MBS
    grads = 2 * 2 * T * H                               # the incoming and outgoing [s, b, h] gradients
    cfg = config("G-", GDN + "--ffn-hidden-size 64")
    # widest: the gated delta net's in_proj output gradient, 208 wide, over fc1's 64
    assert _layer_backward_working_set(cfg, (0, 1)) == 2 * T * 208 + grads == 43008
    cfg = config("D-", DSA)
    # DSA's PyTorch path: two fp32 score-sized gradients, b x n x s x s_kv, over fc1's 4h
    assert _layer_backward_working_set(cfg, (0, 1)) == 2 * 4 * MBS * A * SEQ * SEQ + grads == 81920
    cfg = config("D-", DSA + "--dsa-kernel-backend cudnn")
    assert _layer_backward_working_set(cfg, (0, 1)) == 2 * T * 4 * H + grads


@pytest.mark.parametrize("pattern", ["G-", "D-"])
def test_the_whole_model_parameter_count_does_not_depend_on_tp(pattern):
    # One model copy is the same model at any TP size (vocabulary unpadded): the tensors whole on
    # every TP rank (G: in_proj's norm, out_norm; D: the duplicated indexer linears, its k_norm,
    # the duplicated down projections) are counted once, the split ones summed over the ranks.
    from test_hybrid import config
    from megatron_estimator.results.estimate import build_estimate

    flags = GDN if pattern == "G-" else DSA
    totals = [build_estimate(config(pattern, flags + tp(t) + "--make-vocab-size-divisible-by 1 ", world_size=t),
                             environ={}).total_parameters for t in (1, 2, 4)]
    assert totals[0] == totals[1] == totals[2]
