"""Parameter counts: exact integers on toy shapes, published sizes, per pipeline stage."""

import pytest

from conftest import LLAMA3_70B, LLAMA3_8B, TINY_GPT, estimate


def stage_params(text, world_size=1, extra=""):
    return [s.parameters for s in estimate(text, world_size, extra).stages]


# TINY_GPT by hand (h 64, a 4, F 4h = 256, vocab 1000, 32 positions, 4 layers, LayerNorm,
# biases, tied).  megatron/core/transformer/attention.py SelfAttention: linear_qkv h -> 3h
# with bias, linear_proj h -> h with bias; mlp.py: fc1 h -> F, fc2 F -> h, with biases;
# two LayerNorms of 2h (weight + bias) per layer (fused into the following linear in the TE spec).
H, F = 64, 256
VOCAB = 1024                       # ceil(1000 / 128) * 128 (arguments.py _vocab_size_with_padding)
LAYER = 2 * H + (H * 3 * H + 3 * H) + (H * H + H) + 2 * H + (H * F + F) + (F * H + H)
EMBEDDING = VOCAB * H              # language_model_embedding.py word_embeddings
POSITIONS = 32 * H                 # learned_absolute position_embeddings, max_position_embeddings 32
FINAL_NORM = 2 * H
TINY_GPT_PARAMETERS = 4 * LAYER + EMBEDDING + POSITIONS + FINAL_NORM


def test_tiny_gpt_counted_by_hand():
    assert stage_params(TINY_GPT) == [TINY_GPT_PARAMETERS]
    assert estimate(TINY_GPT).total_parameters == TINY_GPT_PARAMETERS


def test_tiny_gpt_equals_a_megatron_core_build():
    # The same shape built by megatron-core 0.16.1 on the meta device (tests/mcore_reference.py).
    ref = pytest.importorskip("mcore_reference")
    ok, why = ref.megatron_core_available()
    if not ok:
        pytest.skip(f"megatron-core is not installed here: {why}")
    [stage] = ref.reference_parameter_counts(dict(num_layers=4, hidden_size=H, num_attention_heads=4,
                                                  ffn_hidden_size=F, padded_vocab_size=VOCAB,
                                                  max_position_embeddings=32))
    assert stage.te_total == stage.total == TINY_GPT_PARAMETERS


def test_tiny_gpt_pipeline_split_holds_tied_copy_on_last_stage():
    # With pp 2 and tied embeddings the last stage keeps its own copy of the word embeddings
    # (gpt_model.py: output_layer with skip_weight_param_allocation=False off the first stage).
    first, last = stage_params(TINY_GPT, 2, "--pipeline-model-parallel-size 2")
    assert first == EMBEDDING + POSITIONS + 2 * LAYER
    assert last == 2 * LAYER + FINAL_NORM + EMBEDDING
    # ... but the model still has one set of parameters.
    assert estimate(TINY_GPT, 2, "--pipeline-model-parallel-size 2").total_parameters == TINY_GPT_PARAMETERS


def test_tiny_gpt_tensor_parallel_shards():
    # tp 2: column-parallel outputs and row-parallel inputs halve; norms and the row-parallel
    # output biases stay whole; the vocab pads to a multiple of 128 x 2 = 256 (still 1024).
    t = 2
    layer = (2 * H + (H * 3 * H // t + 3 * H // t) + (H // t * H + H) + 2 * H
             + (H * F // t + F // t) + (F // t * H + H))
    assert stage_params(TINY_GPT, 2, "--tensor-model-parallel-size 2") == [
        4 * layer + VOCAB // t * H + POSITIONS + FINAL_NORM]
    assert estimate(TINY_GPT, 2, "--tensor-model-parallel-size 2").total_parameters == TINY_GPT_PARAMETERS


def test_untied_adds_an_output_layer():
    output_layer = VOCAB * H
    assert stage_params(TINY_GPT, extra="--untie-embeddings-and-output-weights") == [TINY_GPT_PARAMETERS + output_layer]


def test_swiglu_rmsnorm_no_bias_qk_layernorm():
    extra = "--swiglu --normalization RMSNorm --disable-bias-linear --qk-layernorm --position-embedding-type rope"
    h = 64
    f = int(4 * h * 2 / 3 / 64) * 64   # Megatron's swiglu default: 128
    assert f == 128
    layer = h + h * 3 * h + 2 * 16 + h * h + h + h * 2 * f + f * h
    assert stage_params(TINY_GPT, extra=extra) == [4 * layer + 1024 * h + h]


# LLaMA-3-8B by hand (h 4096, a 32, g 8, d 128, F 14336, RMSNorm, SwiGLU, no biases, untied):
# linear_qkv h x (a + 2g) d, linear_proj a d x h, fc1 h x 2F (gated), fc2 F x h, two RMSNorms of h.
LLAMA_H, LLAMA_A, LLAMA_G, LLAMA_D, LLAMA_F = 4096, 32, 8, 128, 14336
LLAMA_LAYER = (LLAMA_H * (LLAMA_A + 2 * LLAMA_G) * LLAMA_D + LLAMA_A * LLAMA_D * LLAMA_H
               + 3 * LLAMA_H * LLAMA_F + 2 * LLAMA_H)
LLAMA_EMBEDDING = 128256 * LLAMA_H     # 128256 is already a multiple of 128


def test_llama3_8b_published_size():
    # 32 layers, the embedding, the untied output layer and the final RMSNorm: the published size.
    assert 32 * LLAMA_LAYER + 2 * LLAMA_EMBEDDING + LLAMA_H == 8_030_261_248
    assert estimate(LLAMA3_8B).total_parameters == 8_030_261_248
    assert stage_params(LLAMA3_8B) == [8_030_261_248]


def test_llama3_70b_published_size():
    assert estimate(LLAMA3_70B).total_parameters == 70_553_706_496


def test_llama3_8b_per_stage_with_four_pipeline_stages():
    layer, embedding = LLAMA_LAYER, LLAMA_EMBEDDING
    assert stage_params(LLAMA3_8B, 4, "--pipeline-model-parallel-size 4") == [
        8 * layer + embedding, 8 * layer, 8 * layer, 8 * layer + LLAMA_H + embedding]


def test_uneven_pipeline_split():
    # 32 layers: first stage 5, last stage 3, two middle stages of 12.
    layer, embedding = LLAMA_LAYER, LLAMA_EMBEDDING
    extra = ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5 "
             "--decoder-last-pipeline-num-layers 3")
    est = estimate(LLAMA3_8B, 4, extra)
    assert [s.layers for s in est.stages] == [5, 12, 12, 3]
    assert [s.parameters for s in est.stages] == [
        5 * layer + embedding, 12 * layer, 12 * layer, 3 * layer + LLAMA_H + embedding]


def test_account_for_embedding_and_loss_in_split():
    extra = ("--pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split "
             "--account-for-loss-in-pipeline-split --num-layers 6")
    est = estimate(LLAMA3_8B, 2, extra)
    # (6 + 2) / 2 = 4 per stage; the embedding and the loss each take one slot.
    assert [s.layer_indices for s in est.stages] == [(0, 1, 2), (3, 4, 5)]


def test_virtual_pipeline_interleaves_layers():
    extra = "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4 --global-batch-size 8"
    est = estimate(LLAMA3_8B, 2, extra)
    assert est.parallelism["vpp"] == 4
    assert est.stages[0].layer_indices == (0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
    assert est.stages[1].layer_indices == (4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31)
    assert est.total_parameters == 8_030_261_248


def test_pipeline_layout_string():
    # Four stages over two ranks: stage i runs on rank i % 2 as virtual stage i // 2.
    extra = "--pipeline-model-parallel-size 2 --num-layers 4 --pipeline-model-parallel-layout Et|t|t|tL --global-batch-size 4"
    est = estimate(LLAMA3_8B, 2, extra)
    assert est.parallelism["vpp"] == 2
    assert [s.layer_indices for s in est.stages] == [(0, 2), (1, 3)]
    layer, embedding = LLAMA_LAYER, LLAMA_EMBEDDING
    assert [s.parameters for s in est.stages] == [2 * layer + embedding, 2 * layer + LLAMA_H + embedding]


def test_null_tokenizer_counts_its_end_of_document_token():
    # Through 0.17 megatron's NullTokenizer reports vocab_size + 1 (the EOD id), then padded to
    # 128 x tp; from c9dfe34798 (0.18.0) exactly vocab_size.
    from conftest import resolve
    base = TINY_GPT.replace("--vocab-size 1000", "--tokenizer-type NullTokenizer --vocab-size 1024")
    assert resolve(base, release="0.17.1").model.padded_vocab_size == 1152
    assert resolve(base, 2, extra="--tensor-model-parallel-size 2", release="0.17.1").model.padded_vocab_size == 1280
    for label in ("0.18.0", "main"):
        assert resolve(base, release=label).model.padded_vocab_size == 1024
        assert resolve(base, 2, extra="--tensor-model-parallel-size 2", release=label).model.padded_vocab_size == 1024
    assert resolve(TINY_GPT.replace("--vocab-size 1000", "--vocab-size 1024")).model.padded_vocab_size == 1024


def test_learnable_softmax_offsets_one_per_head_per_layer():
    # --softmax-type learnable (gpt-oss's attention sinks): dot_product_attention.py registers
    # core_attention.softmax_offset of num_attention_heads / tp elements in every layer:
    # 4 layers x 4 heads = 16 more at TP 1, 4 x 2 per GPU at TP 2.
    extra = "--softmax-type learnable"
    assert stage_params(TINY_GPT, extra=extra) == [TINY_GPT_PARAMETERS + 4 * 4]
    t = 2
    layer = (2 * H + (H * 3 * H // t + 3 * H // t) + (H // t * H + H) + 2 * H
             + (H * F // t + F // t) + (F // t * H + H)) + 4 // t
    assert stage_params(TINY_GPT, 2, "--tensor-model-parallel-size 2 " + extra) == [
        4 * layer + VOCAB // t * H + POSITIONS + FINAL_NORM]
    assert estimate(TINY_GPT, extra=extra + " --softmax-type vanilla").total_parameters == TINY_GPT_PARAMETERS


@pytest.mark.parametrize("tp", [1, 2])
def test_learnable_softmax_offsets_equal_a_megatron_core_build(tp):
    ref = pytest.importorskip("mcore_reference")
    ok, why = ref.megatron_core_available()
    if not ok:
        pytest.skip(f"megatron-core is not installed here: {why}")
    [stage] = ref.reference_parameter_counts(dict(num_layers=4, hidden_size=H, num_attention_heads=4,
                                                  ffn_hidden_size=F, padded_vocab_size=VOCAB,
                                                  max_position_embeddings=32, softmax_type="learnable",
                                                  tensor_model_parallel_size=tp))
    offsets = [p for p in stage.tensors if p.name.endswith("core_attention.softmax_offset")]
    assert len(offsets) == 4 and all(p.numel == 4 // tp for p in offsets)
    extra = "--softmax-type learnable" + (f" --tensor-model-parallel-size {tp}" if tp > 1 else "")
    assert stage_params(TINY_GPT, tp, extra) == [stage.total]
