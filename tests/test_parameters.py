"""Parameter counts: exact integers on toy shapes, published sizes, per pipeline stage."""

from conftest import LLAMA3_70B, LLAMA3_8B, TINY_GPT, estimate


def stage_params(text, world_size=1, extra=""):
    return [s.parameters for s in estimate(text, world_size, extra).stages]


def test_tiny_gpt_counted_by_hand():
    # Per layer: LayerNorm 2h, qkv h*3h + 3h, proj h*h + h, LayerNorm 2h, fc1 h*4h + 4h, fc2 4h*h + h
    h, f = 64, 256
    layer = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)
    assert layer == 49984
    embedding = 1024 * h          # vocab 1000 padded to a multiple of 128
    positions = 32 * h
    final_norm = 2 * h
    assert stage_params(TINY_GPT) == [4 * layer + embedding + positions + final_norm] == [267648]
    assert estimate(TINY_GPT).total_parameters == 267648


def test_tiny_gpt_pipeline_split_holds_tied_copy_on_last_stage():
    # With pp 2 and tied embeddings the last stage keeps its own copy of the word embeddings.
    first, last = stage_params(TINY_GPT, 2, "--pipeline-model-parallel-size 2")
    assert first == 65536 + 2048 + 2 * 49984 == 167552
    assert last == 2 * 49984 + 128 + 65536 == 165632
    # ... but the model still has one set of parameters.
    assert estimate(TINY_GPT, 2, "--pipeline-model-parallel-size 2").total_parameters == 267648


def test_tiny_gpt_tensor_parallel_shards():
    # tp 2: column-parallel outputs and row-parallel inputs halve; norms and the row-parallel
    # output biases stay whole; the vocab pads to a multiple of 128 x 2 = 256 (still 1024).
    layer = 128 + (64 * 96 + 96) + (32 * 64 + 64) + 128 + (64 * 128 + 128) + (128 * 64 + 64)
    assert layer == 25184
    assert stage_params(TINY_GPT, 2, "--tensor-model-parallel-size 2") == [4 * layer + 512 * 64 + 2048 + 128]
    assert estimate(TINY_GPT, 2, "--tensor-model-parallel-size 2").total_parameters == 267648


def test_untied_adds_an_output_layer():
    assert stage_params(TINY_GPT, extra="--untie-embeddings-and-output-weights") == [267648 + 65536]


def test_swiglu_rmsnorm_no_bias_qk_layernorm():
    extra = "--swiglu --normalization RMSNorm --disable-bias-linear --qk-layernorm --position-embedding-type rope"
    h = 64
    f = int(4 * h * 2 / 3 / 64) * 64   # Megatron's swiglu default: 128
    assert f == 128
    layer = h + h * 3 * h + 2 * 16 + h * h + h + h * 2 * f + f * h
    assert stage_params(TINY_GPT, extra=extra) == [4 * layer + 1024 * h + h]


def test_llama3_8b_published_size():
    assert estimate(LLAMA3_8B).total_parameters == 8_030_261_248
    assert stage_params(LLAMA3_8B) == [8_030_261_248]


def test_llama3_70b_published_size():
    assert estimate(LLAMA3_70B).total_parameters == 70_553_706_496


def test_llama3_8b_per_stage_with_four_pipeline_stages():
    layer = 218_112_000
    embedding = 128256 * 4096
    assert stage_params(LLAMA3_8B, 4, "--pipeline-model-parallel-size 4") == [
        8 * layer + embedding, 8 * layer, 8 * layer, 8 * layer + 4096 + embedding]


def test_uneven_pipeline_split():
    # 32 layers: first stage 5, last stage 3, two middle stages of 12.
    layer = 218_112_000
    embedding = 128256 * 4096
    extra = ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5 "
             "--decoder-last-pipeline-num-layers 3")
    est = estimate(LLAMA3_8B, 4, extra)
    assert [s.layers for s in est.stages] == [5, 12, 12, 3]
    assert [s.parameters for s in est.stages] == [
        5 * layer + embedding, 12 * layer, 12 * layer, 3 * layer + 4096 + embedding]


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
    layer = 218_112_000
    embedding = 128256 * 4096
    assert [s.parameters for s in est.stages] == [2 * layer + embedding, 2 * layer + 4096 + embedding]


def test_null_tokenizer_counts_its_end_of_document_token():
    # megatron's _NullTokenizer: vocab_size + 1 (the EOD id), then padded to 128 x tp.
    from conftest import resolve

    base = TINY_GPT.replace("--vocab-size 1000", "--tokenizer-type NullTokenizer --vocab-size 1024")
    assert resolve(base).model.padded_vocab_size == 1152
    assert resolve(base, 2, extra="--tensor-model-parallel-size 2").model.padded_vocab_size == 1280
    assert resolve(TINY_GPT.replace("--vocab-size 1000", "--vocab-size 1024")).model.padded_vocab_size == 1024
