"""MLA's q / kv norms with --qk-layernorm, per Megatron release, itemised by hand.

Megatron-LM 4464d1c197 (#4452, first in 0.19.0) added megatron/core/transformer/
mla_qk_norm_config.py (QKNormConfigResolver), which MLASelfAttention asks which q / kv norms and
projections to build.  With --qk-layernorm and a trivial (IdentityOp) norm in the spec it builds
the backend's fused norm + linear instead of the spec's linear:

- with --q-lora-rank: linear_q_up_proj (norm over q_lora_rank) and linear_kv_up_proj (norm over
  kv_lora_rank).  The GPT TE spec already named those fused layers (every release); the hybrid
  '+' spec names plain TE linears, so its norms exist only through the resolver;
- without --q-lora-rank: linear_q_proj, a norm over the hidden size.  Before 4464d1c197 the GPT
  spec's plain linear_q_proj was built and the q norm did not exist (0.14.0 .. 0.18.0).

A fused layer's norm is whole on every TP rank (layer_norm_weight, + layer_norm_bias for
LayerNorm).  The local spec has standalone norms and no fused layer: from 0.19.0 the resolver
refuses its q norm without --q-lora-rank.  tests/test_mla_norms_mcore.py checks the same shapes
against Megatron-LM main's own MLASelfAttention.
"""

from __future__ import annotations

import pytest

from conftest import problems_of, resolve

from megatron_estimator.megatron.releases import release_of
from megatron_estimator.model.parameters import attention_tensors, count, layer_tensors

H, A, KV, QK, PE, V = 64, 4, 16, 8, 8, 8
Q_HEAD = QK + PE                      # 16
MLA = (f"--hidden-size {H} --num-attention-heads {A} --multi-latent-attention --kv-lora-rank {KV} "
       f"--qk-head-dim {QK} --qk-pos-emb-head-dim {PE} --v-head-dim {V} --position-embedding-type rope "
       "--seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --vocab-size 1000 --bf16 "
       "--hidden-dropout 0 --disable-bias-linear ")
GPT = "--num-layers 2 --ffn-hidden-size 256 " + MLA
# hybrid: the pattern sets --num-layers and MLA; Mamba shape for the 'M' layer
HYBRID = MLA + "--mamba-head-dim 16 --mamba-state-dim 8 --mamba-num-groups 2 --hybrid-layer-pattern M+ "


def norm(size: int, normalization: str) -> int:
    return size * (2 if normalization == "LayerNorm" else 1)       # weight (+ bias)


def mla_attention(t: int, q_lora: int | None, normalization: str, q_norm: bool, kv_norm: bool) -> int:
    """One MLASelfAttention (TE / hybrid spec) + its input norm on one of t TP ranks:
    multi_latent_attention.py MLASelfAttention.__init__, the down projections TELinear
    duplicated (whole), the up / q / out projections column / row parallel, no biases."""
    total = norm(H, normalization)                                 # input_layernorm
    if q_lora is None:
        total += norm(H, normalization) if q_norm else 0           # linear_q_proj's fused norm
        total += H * (A * Q_HEAD // t)                             # linear_q_proj
    else:
        total += H * q_lora                                        # linear_q_down_proj (duplicated)
        total += norm(q_lora, normalization) if q_norm else 0      # linear_q_up_proj's fused norm
        total += q_lora * (A * Q_HEAD // t)                        # linear_q_up_proj
    total += H * (KV + PE)                                         # linear_kv_down_proj (duplicated)
    total += norm(KV, normalization) if kv_norm else 0             # linear_kv_up_proj's fused norm
    total += KV * (A * (QK + V) // t)                              # linear_kv_up_proj
    total += (A * V // t) * H                                      # linear_proj
    return total


def _config(text: str, world: int, release: str):
    """The typed configuration, its family told from the flags (hybrid for a pattern)."""
    import shlex

    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.inputs.entry_script import model_family

    raw, problems = parse_megatron_argv(shlex.split(text), release=release)
    assert not problems, problems
    return resolve_config(raw, world_size=world, world_size_source="test", environ={}, family=model_family(raw),
                          release=release_of(release, "test"))


def _attention(text: str, t: int, release: str, layer: int | None = None) -> int:
    config = _config(text + f" --tensor-model-parallel-size {t}", t, release)
    if layer is not None:
        assert config.model.hybrid is not None and config.model.hybrid.layer_kinds[layer] == "+"
    if layer is None:
        return count(attention_tensors(config, "")).total
    return count(layer_tensors(config, layer, "")).total


CASES = [(q_lora, normalization, t) for q_lora in (32, None) for normalization in ("LayerNorm", "RMSNorm")
         for t in (1, 2)]


@pytest.mark.parametrize("q_lora, normalization, t", CASES)
@pytest.mark.parametrize("release", ["0.16.1", "0.18.0", "0.19.0", "main"])
def test_gpt_mla_attention_per_release(release, q_lora, normalization, t):
    flags = GPT + f"--normalization {normalization} --qk-layernorm"
    if q_lora is not None:
        flags += f" --q-lora-rank {q_lora}"
    resolved = release in ("0.19.0", "main")
    # q norm: over q_lora_rank in every release; over the hidden size in linear_q_proj only
    # from 0.19.0.  kv norm: every release.
    expected = mla_attention(t, q_lora, normalization, q_norm=q_lora is not None or resolved, kv_norm=True)
    assert _attention(flags, t, release) == expected


@pytest.mark.parametrize("q_lora, normalization, t", CASES)
def test_gpt_mla_attention_without_qk_layernorm_has_no_q_kv_norms(q_lora, normalization, t):
    flags = GPT + f"--normalization {normalization}" + (f" --q-lora-rank {q_lora}" if q_lora else "")
    assert _attention(flags, t, "main") == mla_attention(t, q_lora, normalization, q_norm=False, kv_norm=False)


@pytest.mark.parametrize("q_lora, normalization, t", CASES)
def test_hybrid_mla_layer_has_the_resolved_norms(q_lora, normalization, t):
    # hybrid_layer_specs.py mla_layer: TEColumnParallelLinear up / q projections, IdentityOp
    # norms, TENorm input norm: with --qk-layernorm every q / kv norm comes from the resolver.
    flags = HYBRID + f"--normalization {normalization}" + (f" --q-lora-rank {q_lora}" if q_lora else "")
    with_norms = _attention(flags + " --qk-layernorm", t, "main", layer=1)
    without = _attention(flags, t, "main", layer=1)
    assert with_norms == mla_attention(t, q_lora, normalization, q_norm=True, kv_norm=True)
    assert without == mla_attention(t, q_lora, normalization, q_norm=False, kv_norm=False)


def test_the_exact_toy_figures():
    # Two cases written out in full, tp 2, RMSNorm, main:
    # with --q-lora-rank 32: norm 64; q down 64 x 32 = 2048; q norm 32; q up 32 x 32 = 1024;
    # kv down 64 x 24 = 1536; kv norm 16; kv up 16 x 32 = 512; proj 16 x 64 = 1024 -> 6256.
    assert mla_attention(2, 32, "RMSNorm", True, True) == 6256
    assert _attention(GPT + "--normalization RMSNorm --qk-layernorm --q-lora-rank 32", 2, "main") == 6256
    # without: norm 64; q norm 64; q 64 x 32 = 2048; kv 1536 + 16 + 512; proj 1024 -> 5264
    # (5200 at 0.18.0: no q norm).
    assert _attention(GPT + "--normalization RMSNorm --qk-layernorm", 2, "main") == 5264
    assert _attention(GPT + "--normalization RMSNorm --qk-layernorm", 2, "0.18.0") == 5200


def test_linear_q_proj_norm_activations_from_0_19():
    # TE's LayerNormLinear keeps its normalized input (the GEMM's, bf16: 2 bytes) and the norm's
    # fp32 rsigma per token; its own input is the layer's input norm output, kept anyway.
    # tp 2 with sequence parallelism: 32 x 2 / 2 = 32 tokens per rank of hidden size 64.
    from megatron_estimator.model.activations import layer_activations

    flags = GPT + "--normalization RMSNorm --qk-layernorm --tensor-model-parallel-size 2 --sequence-parallel"
    totals = {}
    for release in ("0.18.0", "main"):
        totals[release] = layer_activations(resolve(flags, 2, release=release), 1).total
    assert totals["main"] - totals["0.18.0"] == 2 * 32 * H + 4 * 32


# -- what the resolver refuses -------------------------------------------------------------------

def _codes(text: str, release: str, world: int = 1) -> list[str]:
    return [p.code for p in problems_of(text, world, release=release)]


@pytest.mark.parametrize("release", ["0.14.0", "0.18.0", "main"])
def test_qk_l2_norm_is_refused_with_gpt_mla_in_every_release(release):
    # gpt_layer_specs.py asserts qk_l2_norm is False for its MLA specs (every release)
    assert "mla-with-qk-l2-norm" in _codes(GPT + "--qk-l2-norm", release)
    assert "mla-with-qk-l2-norm" not in _codes(GPT, release)


@pytest.mark.parametrize("release, refused", [("0.18.0", False), ("main", True)])
def test_qk_l2_norm_with_hybrid_mla_from_0_19(release, refused):
    # mla_qk_norm_config.py raises for MLA / DSA layers; 0.18's hybrid spec had no such check
    assert ("mla-with-qk-l2-norm" in _codes(HYBRID + "--qk-l2-norm", release)) == refused


@pytest.mark.parametrize("release, refused", [("0.16.1", False), ("0.18.0", False), ("0.19.0", True),
                                              ("main", True)])
def test_local_spec_q_norm_without_q_lora_from_0_19(release, refused):
    # the local spec's q_layernorm is a real norm with --qk-layernorm; without --q-lora-rank it
    # was never built before 0.19.0, and the resolver refuses it since (ValueError)
    text = GPT + "--transformer-impl local --qk-layernorm"
    assert ("mla-q-norm-unused" in _codes(text, release)) == refused
    assert "mla-q-norm-unused" not in _codes(text + " --q-lora-rank 32", release)
    assert "mla-q-norm-unused" not in _codes(GPT + "--transformer-impl local", release)


def test_local_backend_cannot_hold_the_hybrid_mla_norms():
    # the hybrid '+' spec's trivial norms need the backend's fused norm + linear (RuntimeError)
    assert "mla-qk-norm-needs-te" in _codes(HYBRID + "--transformer-impl local --qk-layernorm", "main")
    assert "mla-qk-norm-needs-te" not in _codes(HYBRID + "--transformer-impl local", "main")
    assert "mla-qk-norm-needs-te" not in _codes(HYBRID + "--qk-layernorm", "main")


def test_local_spec_counts_without_q_lora_before_0_19():
    # 0.18.0, local spec, no --q-lora-rank: the q norm is not built, the kv norm is standalone;
    # the down projections are ColumnParallelLinear (split over tp 2): kv down 64 x 24 / 2.
    text = GPT + "--normalization RMSNorm --qk-layernorm --transformer-impl local"
    expected = 64 + 64 * 32 + 64 * 24 // 2 + 16 + 16 * 32 + 16 * 64
    assert _attention(text, 2, "0.18.0") == expected
