"""HuggingFace config.json import (megatron_estimator.inputs.hf) and named presets (megatron_estimator.inputs.presets).

Real published config.json files (fixtures/hf/ and the presets) are mapped to the Megatron flags
that rebuild them; megatron-core 0.16.1 then builds each mapped model on the meta device and its
parameter count must equal the published size.  The counts are pinned below so that the
estimator's own parameter model can be asserted against them without megatron-core:

    from test_hf import PRESET_PARAMETERS, FIXTURE_PARAMETERS
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from megatron_estimator.inputs.hf import SUPPORTED_MODEL_TYPES, load_hf_config, parse_hf_config
from megatron_estimator.inputs.hf.result import SUPPLIED_FLAGS, layer_pattern_text
from megatron_estimator.inputs.presets import load_preset, preset_names
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting

FIXTURES = Path(__file__).parent / "fixtures" / "hf"

# Parameter counts measured with megatron-core 0.16.1 (GPTModel, local layer specs, TP=PP=1, meta
# device) from each preset's mapped flags: (vocabulary as published, i.e.
# --make-vocab-size-divisible-by 1; Megatron's default padding to a multiple of 128 at TP=1).
# Each equals the published size of the HuggingFace model, except DeepSeek-V3: its count holds the
# 671,026,404,352-parameter main model plus one MTP layer (11,610,067,968: a MoE layer, eh_proj
# 2h x h and three norms) that shares Megatron's embedding and output layer; the published 685B also
# counts the MTP module's own copies of those, e_score_correction_bias (a buffer in Megatron) and
# fp8 scale tensors.
PRESET_PARAMETERS: dict[str, tuple[int, int]] = {
    "deepseek-v2-lite": (15_706_484_224, 15_706_484_224),
    "deepseek-v3": (682_636_472_320, 682_636_472_320),
    "gpt2": (124_439_808, 124_475_904),
    "llama3-70b": (70_553_706_496, 70_553_706_496),
    "llama3-8b": (8_030_261_248, 8_030_261_248),
    "llama3.1-405b": (405_853_388_800, 405_853_388_800),
    "mistral-7b": (7_241_732_096, 7_241_732_096),
    "mixtral-8x7b": (46_702_792_704, 46_702_792_704),
    "qwen2.5-7b": (7_615_616_512, 7_615_616_512),
    "qwen3-30b-a3b": (30_532_122_624, 30_532_122_624),
    "qwen3-8b": (8_190_735_360, 8_190_735_360),
}

# Hybrid Mamba presets: megatron-core's GPTModel cannot build them (tests/test_hf_nemotron.py
# pins their sizes, tests/test_mcore_crosscheck.py builds the hybrid stack).
HYBRID_PRESETS = ("nemotron-3-nano-30b-a3b", "nemotron-h-56b", "nemotron-h-8b", "nemotron-nano-9b-v2")

# The same for the fixtures: published sizes for the real configs; hand-counted for the tiny ones.
FIXTURE_PARAMETERS: dict[str, tuple[int, int]] = {
    "llama-7b.json": (6_738_415_616, 6_738_415_616),  # LLaMA-1 7B
    "llama2-7b.json": (6_738_415_616, 6_738_415_616),
    "llama3.2-1b.json": (1_235_814_400, 1_235_814_400),  # tied embeddings
    "qwen2.5-0.5b.json": (494_032_768, 494_032_768),  # tied, q/k/v biases
    "qwen3-0.6b.json": (596_049_920, 596_049_920),  # head_dim 128 != 1024 / 16
    "qwen1.5-moe-a2.7b.json": (14_315_784_192, 14_315_784_192),  # gated shared expert
    "pythia-160m": (162_322_944, 162_322_944),  # gpt_neox, directory input
    # OpenAI's model card: 20.91B (hand itemisation in tests/test_hf_gpt_oss.py); biases, sinks.
    "gpt-oss-20b.json": (20_914_757_184, 20_914_757_184),
    # 4 layers, h 256, MLA (q_lora 64, kv_lora 32, 4 heads of 16+8 / 16), first layer dense (F 512),
    # then 8 experts of 64 + shared 128, vocab 1000 (padded 1024), untied:
    #   attention 16384+64+6144+10240+32+4096+16384 = 53344; norms 512; dense MLP 393216;
    #   MoE 2048 + 393216 + 98304 = 493568; embeddings 2 x 1000 x 256; final norm 256
    #   = 512000 + (53344+512+393216) + 3 x (53344+512+493568) + 256 = 2601600 (+2 x 24 x 256 padded).
    "tiny-deepseek-v2.json": (2_601_600, 2_613_888),
    # 4 layers, h 128, 4 heads / 2 groups, q/k/v bias; layer 1 sparse (step 2; layer 3 listed dense):
    #   attention 16512+16512+16384 = 49408; norms 256; dense MLP 98304;
    #   MoE 512 + 49152 + shared 24576 + gate 128 = 74368; embeddings 2 x 1000 x 128; final norm 128
    #   = 3 x 147968 + 124032 + 256000 + 128 = 824064 (+2 x 24 x 128 padded).
    "tiny-qwen2-moe-sparse.json": (824_064, 830_208),
    # 2 layers, h 64, 4 heads / 2 groups, F 128, tied vocab 256: 2 x 36992 + 16384 + 64.
    "tiny-llama-rope-parameters.json": (90_432, 90_432),
    # Itemised by hand in tests/test_hf_deepseek_glm.py (the checkpoint less MTP copies and router biases).
    "glm-4.5.json": (356_785_884_416, 356_785_884_416),
    "glm-4.5-air.json": (109_227_304_960, 109_227_304_960),
    "kimi-k2.json": (1_026_408_209_408, 1_026_408_209_408),
}
# Fixtures megatron-core's GPTModel cannot build: DeepSeek-V3.2's DSA maps to a hybrid pattern
# (tests/test_hf_deepseek_glm.py itemises it).
HYBRID_FIXTURES = ("deepseek-v3.2-exp.json",)


def _fixture(name: str):
    return load_hf_config(FIXTURES / name)


def _settings(imported) -> dict:
    return {dest: setting.value for dest, setting in imported.raw.settings.items()}


# --------------------------------------------------------------------------------------------
# Presets


def test_preset_names_are_the_published_models():
    assert preset_names() == (
        "deepseek-v2-lite", "deepseek-v3", "gpt2", "llama3-70b", "llama3-8b", "llama3.1-405b",
        "mistral-7b", "mixtral-8x7b", "nemotron-3-nano-30b-a3b", "nemotron-h-56b", "nemotron-h-8b",
        "nemotron-nano-9b-v2", "qwen2.5-7b", "qwen3-30b-a3b", "qwen3-8b",
    )
    # The hybrid (Nemotron-H) presets are pinned in tests/test_hf_nemotron.py.
    assert set(PRESET_PARAMETERS) | set(HYBRID_PRESETS) == set(preset_names())


@pytest.mark.parametrize("name", preset_names())
def test_presets_map_without_problems_or_unread_keys(name):
    imported = load_preset(name)
    assert imported.problems == ()
    codes = {note.code for note in imported.notes}
    # Presets hold only architecture keys, stated explicitly: nothing unread, no defaults assumed.
    assert codes <= {"hf-vocab-padded", "hf-approximated"}
    assert imported.source == f"presets/{name}.json"
    assert imported.raw.source == f"presets/{name}.json"


def test_llama3_8b_flags_are_a_megatron_launch_line():
    imported = load_preset("llama3-8b")
    assert imported.model_type == "llama"
    assert imported.flags == (
        "--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
        "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
        "--max-position-embeddings", "8192", "--vocab-size", "128256",
        "--untie-embeddings-and-output-weights", "--normalization", "RMSNorm",
        "--norm-epsilon", "1e-05", "--swiglu", "--disable-bias-linear",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--position-embedding-type", "rope", "--rotary-base", "500000",
    )
    assert imported.raw.settings["num_layers"] == RawSetting("num_layers", 32, "presets/llama3-8b.json:12 num_hidden_layers")
    assert imported.raw.settings["add_bias_linear"] == RawSetting("add_bias_linear", False, "presets/llama3-8b.json:5 attention_bias")
    assert imported.raw.settings["normalization"].location == "presets/llama3-8b.json:4 model_type"
    assert _settings(imported)["rotary_base"] == 500000 and isinstance(_settings(imported)["rotary_base"], int)


def test_mapping_says_which_key_supplies_each_flag():
    imported = load_preset("llama3-8b")
    described = [item.describe() for item in imported.mapping]
    assert described[:4] == [
        "--num-layers 32 (num_hidden_layers)",
        "--hidden-size 4096 (hidden_size)",
        "--ffn-hidden-size 14336 (intermediate_size)",
        "--num-attention-heads 32 (num_attention_heads)",
    ]
    assert "--group-query-attention (num_key_value_heads)" in described
    assert "--untie-embeddings-and-output-weights (tie_word_embeddings)" in described
    assert "--swiglu (hidden_act)" in described
    hf_key, flag, value = imported.mapping[0]  # a plain 3-tuple as well
    assert (hf_key, flag, value) == ("num_hidden_layers", "--num-layers", 32)


def test_llama31_rope_scaling_maps_to_megatron_llama3_scaling():
    imported = load_preset("llama3.1-405b")
    settings = _settings(imported)
    assert settings["use_rope_scaling"] is True
    assert settings["rope_scaling_factor"] == 8.0
    assert imported.raw.location("rope_scaling_factor") == "presets/llama3.1-405b.json:17 rope_scaling.factor"
    assert imported.raw.location("use_rope_scaling") == "presets/llama3.1-405b.json:21 rope_scaling.rope_type"
    # low/high frequency factors and the original length equal Megatron's fixed ones: no note.
    assert imported.notes == ()


def test_mixtral_experts():
    imported = load_preset("mixtral-8x7b")
    assert imported.flags[-4:] == ("--num-experts", "8", "--moe-router-topk", "2")
    assert "--moe-ffn-hidden-size" not in imported.flags  # defaults to --ffn-hidden-size 14336
    assert _settings(imported)["rotary_base"] == 1000000


def test_mistral_sliding_window():
    imported = load_preset("mistral-7b")
    assert _settings(imported)["window_size"] == (4096, 0)
    assert imported.flags[-2:] == ("--window-size", "4096,0")
    assert [note.code for note in imported.notes] == ["hf-approximated"]
    assert imported.notes[0].location == "presets/mistral-7b.json:14 sliding_window"


def test_qwen25_has_qkv_bias_and_no_other_bias():
    settings = _settings(load_preset("qwen2.5-7b"))
    assert settings["add_bias_linear"] is False
    assert settings["add_qkv_bias"] is True
    assert settings["num_query_groups"] == 4


def test_qwen3_qk_layernorm_and_head_dim():
    settings = _settings(load_preset("qwen3-8b"))
    assert settings["qk_layernorm"] is True
    assert settings["kv_channels"] == 128
    assert "add_qkv_bias" not in settings


def test_qwen3_moe_flags():
    imported = load_preset("qwen3-30b-a3b")
    assert imported.flags[-6:] == (
        "--num-experts", "128", "--moe-router-topk", "8", "--moe-ffn-hidden-size", "768",
    )
    settings = _settings(imported)
    assert settings["kv_channels"] == 128 and settings["qk_layernorm"] is True
    assert "moe_layer_freq" not in settings  # every layer is sparse
    assert "moe_router_pre_softmax" not in settings  # norm_topk_prob true


def test_deepseek_v3_flags():
    imported = load_preset("deepseek-v3")
    assert imported.flags[imported.flags.index("--multi-latent-attention"):] == (
        "--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512",
        "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128",
        "--qk-layernorm", "--position-embedding-type", "rope", "--rotary-base", "10000",
        "--rope-type", "yarn", "--rotary-scaling-factor", "40.0", "--mscale", "1.0",
        "--mscale-all-dim", "1.0", "--num-experts", "256", "--moe-ffn-hidden-size", "2048",
        "--moe-router-topk", "8", "--moe-layer-freq", "([0]*3+[1]*58)",
        "--moe-shared-expert-intermediate-size", "2048", "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias", "--moe-router-num-groups", "8",
        "--moe-router-group-topk", "4", "--moe-router-topk-scaling-factor", "2.5",
        "--mtp-num-layers", "1",
    )
    settings = _settings(imported)
    assert settings["moe_layer_freq"] == [0, 0, 0] + [1] * 58
    assert settings["ffn_hidden_size"] == 18432
    assert imported.raw.location("moe_layer_freq") == "presets/deepseek-v3.json:7 first_k_dense_replace"
    assert imported.raw.location("mtp_num_layers") == "presets/deepseek-v3.json:23 num_nextn_predict_layers"


def test_deepseek_v2_lite_has_no_query_compression():
    imported = load_preset("deepseek-v2-lite")
    settings = _settings(imported)
    assert "q_lora_rank" not in settings  # q_lora_rank null: one q projection, no q norm
    assert settings["kv_lora_rank"] == 512
    assert settings["moe_shared_expert_intermediate_size"] == 2 * 1408
    assert settings["moe_layer_freq"] == [0] + [1] * 26
    assert settings["moe_router_pre_softmax"] is True  # softmax, norm_topk_prob false
    assert settings["mscale"] == 0.707 and settings["mscale_all_dim"] == 0.707
    assert "mtp_num_layers" not in settings and "moe_router_num_groups" not in settings


def test_gpt2_flags_and_vocab_padding_note():
    imported = load_preset("gpt2")
    assert imported.flags == (
        "--num-layers", "12", "--hidden-size", "768", "--ffn-hidden-size", "3072",
        "--num-attention-heads", "12", "--max-position-embeddings", "1024", "--vocab-size", "50257",
        "--normalization", "LayerNorm", "--norm-epsilon", "1e-05",
        "--position-embedding-type", "learned_absolute",
        "--attention-dropout", "0.1", "--hidden-dropout", "0.1",
    )
    padded = [note for note in imported.notes if note.code == "hf-vocab-padded"]
    assert len(padded) == 1
    assert padded[0].location == "presets/gpt2.json:17 vocab_size"
    assert "50257 becomes 50304" in padded[0].message
    assert "--make-vocab-size-divisible-by 1" in padded[0].message


def test_unknown_preset_suggests_the_nearest():
    imported = load_preset("llama3-8")
    assert not imported.ok
    (problem,) = imported.problems
    assert problem.code == "unknown-preset"
    assert problem.location == "llama3-8"
    assert "did you mean llama3-8b?" in problem.message
    assert "qwen3-30b-a3b" in problem.message  # lists what exists
    assert imported.raw == RawArgs({}, "preset llama3-8") and imported.flags == ()


# --------------------------------------------------------------------------------------------
# Each model type, from real published configs


def test_llama1_without_kv_heads_or_rope_theta():
    imported = _fixture("llama-7b.json")
    settings = _settings(imported)
    assert "group_query_attention" not in settings  # no num_key_value_heads: one kv head per head
    assert settings["rotary_base"] == 10000
    assert settings["layernorm_epsilon"] == 1e-06
    notes = {(note.code, note.location) for note in imported.notes}
    source = str(FIXTURES / "llama-7b.json")
    assert notes == {
        ("hf-default-used", f"{source}:1 model_type"),  # rope_theta absent -> LlamaConfig default
        ("hf-key-not-read", f"{source}:1 max_sequence_length"),
    }


def test_llama2_mha_has_no_query_groups():
    settings = _settings(_fixture("llama2-7b.json"))
    assert settings["num_attention_heads"] == 32
    assert "group_query_attention" not in settings and "num_query_groups" not in settings


def test_llama32_tied_with_head_dim_and_llama3_rope():
    settings = _settings(_fixture("llama3.2-1b.json"))
    assert "untie_embeddings_and_output_weights" not in settings
    assert settings["kv_channels"] == 64
    assert settings["rope_scaling_factor"] == 32.0


def test_qwen2_tied_small_model():
    imported = _fixture("qwen2.5-0.5b.json")
    settings = _settings(imported)
    assert "untie_embeddings_and_output_weights" not in settings
    assert settings["add_qkv_bias"] is True and settings["num_query_groups"] == 2
    assert imported.notes == ()  # use_mrope false, sliding window off


def test_qwen3_head_dim_differs_from_hidden_over_heads():
    settings = _settings(_fixture("qwen3-0.6b.json"))
    assert settings["hidden_size"] // settings["num_attention_heads"] == 64
    assert settings["kv_channels"] == 128


def test_qwen2_moe_shared_expert_gate():
    imported = _fixture("qwen1.5-moe-a2.7b.json")
    assert imported.flags[-10:] == (
        "--num-experts", "60", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "1408",
        "--moe-shared-expert-intermediate-size", "5632", "--moe-shared-expert-gate",
        "--moe-router-pre-softmax",
    )
    settings = _settings(imported)
    assert settings["ffn_hidden_size"] == 5632 and settings["add_qkv_bias"] is True
    assert imported.notes == ()  # router_aux_loss_coef, output_router_logits: training knobs


def test_qwen2_moe_sparse_step_and_dense_layers_make_a_layer_pattern():
    imported = _fixture("tiny-qwen2-moe-sparse.json")
    settings = _settings(imported)
    assert settings["moe_layer_freq"] == [0, 1, 0, 0]
    position = imported.flags.index("--moe-layer-freq")
    assert imported.flags[position + 1] == "([0]+[1]+[0]*2)"
    item = next(m for m in imported.mapping if m.flag == "--moe-layer-freq")
    assert item.hf_key == "decoder_sparse_step+mlp_only_layers"
    assert imported.raw.location("moe_layer_freq") == f"{FIXTURES / 'tiny-qwen2-moe-sparse.json'}:9 decoder_sparse_step"
    assert "moe_router_pre_softmax" not in settings  # norm_topk_prob true


def test_deepseek_v2_group_limited_routing_and_plain_rope():
    imported = _fixture("tiny-deepseek-v2.json")
    settings = _settings(imported)
    assert settings["q_lora_rank"] == 64
    assert settings["moe_router_num_groups"] == 2 and settings["moe_router_group_topk"] == 1
    assert settings["moe_router_topk_scaling_factor"] == 16.0
    assert settings["rope_type"] == "rope"
    assert settings["apply_rope_fusion"] is False  # MLA refuses rope fusion without YaRN
    assert "--no-rope-fusion" in imported.flags


def test_gpt_neox_parallel_residual_is_an_explicit_approximation():
    imported = _fixture("pythia-160m")  # a directory holding config.json
    assert imported.source == str(FIXTURES / "pythia-160m" / "config.json")
    settings = _settings(imported)
    assert settings["rotary_percent"] == 0.25
    assert settings["normalization"] == "LayerNorm"
    assert "add_bias_linear" not in settings and "swiglu" not in settings
    (note,) = imported.notes
    assert note.code == "hf-approximated"
    assert note.location == f"{imported.source}:22 use_parallel_residual"
    assert "parallel residual" in note.message


def test_transformers5_rope_parameters():
    imported = _fixture("tiny-llama-rope-parameters.json")
    settings = _settings(imported)
    assert settings["rotary_base"] == 500000
    assert settings["use_rope_scaling"] is True and settings["rope_scaling_factor"] == 32.0
    approximated = [note for note in imported.notes if note.code == "hf-approximated"]
    assert len(approximated) == 1 and "high_freq_factor 2.0 (Megatron uses 4)" in approximated[0].message


def test_every_supported_model_type_is_exercised():
    types = {load_preset(name).model_type for name in preset_names()}
    types |= {_fixture(name).model_type for name in (*FIXTURE_PARAMETERS, *HYBRID_FIXTURES)}
    # Pinned in their own files (published sizes, hand itemisations): tests/test_hf_gpt_oss.py,
    # tests/test_hf_qwen3_next.py.
    types |= {_fixture(name).model_type for name in ("gpt-oss-20b.json", "qwen3-next-80b-a3b.json")}
    assert types == set(SUPPORTED_MODEL_TYPES)


# --------------------------------------------------------------------------------------------
# Smaller variants, written inline


def _llama(**extra) -> dict:
    config = {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 256, "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    config.update(extra)
    return config


def _parse(config: dict):
    return parse_hf_config(json.dumps(config, indent=2), "config.json")


@pytest.mark.parametrize(
    "attention_bias, mlp_bias, disabled, qkv_bias, note",
    [
        (False, False, True, False, None),
        (True, True, False, False, None),
        (True, False, True, True, "attention_bias"),
        (False, True, False, False, "mlp_bias"),
    ],
)
def test_llama_bias_combinations(attention_bias, mlp_bias, disabled, qkv_bias, note):
    imported = _parse(_llama(attention_bias=attention_bias, mlp_bias=mlp_bias))
    settings = _settings(imported)
    assert ("add_bias_linear" in settings) is disabled
    assert settings.get("add_qkv_bias", False) is qkv_bias
    approximated = [n.location for n in imported.notes if n.code == "hf-approximated"]
    assert approximated == ([] if note is None else [f"config.json:{14 if note == 'attention_bias' else 15} {note}"])


def test_rope_scaling_linear_and_unmapped_kinds():
    linear = _parse(_llama(rope_scaling={"type": "linear", "factor": 4.0}))
    assert _settings(linear)["rotary_seq_len_interpolation_factor"] == 4
    dynamic = _parse(_llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    assert "rotary_seq_len_interpolation_factor" not in _settings(dynamic)
    (note,) = dynamic.notes
    assert note.code == "hf-not-mapped" and note.location == "config.json:14 rope_scaling"
    assert "'dynamic'" in note.message


def test_non_silu_gated_activation_is_noted():
    imported = _parse(_llama(hidden_act="gelu"))
    assert _settings(imported)["swiglu"] is True
    assert [n.code for n in imported.notes] == ["hf-approximated"]


def test_qwen_sliding_window_enabled_is_noted():
    config = json.loads((FIXTURES / "qwen2.5-0.5b.json").read_text())
    config["use_sliding_window"] = True
    imported = _parse(config)
    assert imported.ok
    assert [n.code for n in imported.notes] == ["hf-not-mapped"]
    assert "window_size" not in _settings(imported)


def test_duplicate_keys_use_the_last_value_and_are_noted():
    text = json.dumps(_llama(), indent=2)[:-2] + ',\n  "num_hidden_layers": 3\n}'
    imported = parse_hf_config(text, "config.json")
    assert _settings(imported)["num_layers"] == 3
    assert imported.raw.location("num_layers") == "config.json:14 num_hidden_layers"
    assert [n.code for n in imported.notes] == ["hf-duplicate-key"]


def test_unknown_architecture_key_is_never_silent():
    imported = _parse(_llama(num_dense_blocks=7))
    (note,) = imported.notes
    assert note.code == "hf-key-not-read"
    assert note.location == "config.json:14 num_dense_blocks"


def test_command_line_quotes_layer_patterns():
    line = load_preset("deepseek-v3").command_line()
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in line


@pytest.mark.parametrize(
    "pattern, text",
    [
        ([0, 0, 0] + [1] * 58, "([0]*3+[1]*58)"),
        ([0] + [1] * 26, "([0]+[1]*26)"),
        ([1, 1, 1, 0] * 3, "([1]*3+[0])*3"),
        ([0, 1] * 4, "([0]+[1])*4"),
        ([1, 0, 1, 1], "([1]+[0]+[1]*2)"),
    ],
)
def test_layer_pattern_text_is_megatrons_syntax(pattern, text):
    assert layer_pattern_text(pattern) == text
    # megatron/training/arguments.py _eval_pattern: only , digits [ ] ( ) + * are allowed.
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", text)
    assert eval(text) == pattern


# --------------------------------------------------------------------------------------------
# Problems: every one named at file:line key, all at once, never a traceback


def test_unsupported_model_type():
    path = FIXTURES / "bad" / "bert-base-uncased.json"
    imported = load_hf_config(path)
    (problem,) = imported.problems
    assert problem.code == "unsupported-hf-model"
    assert problem.location == f"{path}:14 model_type"
    assert str(path) in problem.message and "'bert'" in problem.message
    for model_type in SUPPORTED_MODEL_TYPES:
        assert model_type in problem.message
    assert imported.flags == () and imported.raw.settings == {}


def test_missing_keys_are_all_reported():
    path = FIXTURES / "bad" / "missing-keys.json"
    imported = load_hf_config(path)
    assert [(p.code, p.location) for p in imported.problems] == [
        ("hf-missing-key", str(path)),
        ("hf-missing-key", str(path)),
    ]
    assert imported.problems[0].message.startswith("hidden_size is missing")
    assert imported.problems[1].message.startswith("num_key_value_heads is missing")
    assert imported.flags == () and imported.mapping == ()


def test_bad_values_are_all_reported_at_their_lines():
    path = FIXTURES / "bad" / "bad-values.json"
    imported = load_hf_config(path)
    assert sorted((p.code, p.location) for p in imported.problems) == sorted([
        ("hf-bad-value", f"{path}:3 hidden_size"),
        ("hf-bad-value", f"{path}:6 num_attention_heads"),
        ("hf-bad-value", f"{path}:7 num_hidden_layers"),
        ("hf-bad-value", f"{path}:9 rope_theta"),
        ("hf-bad-value", f"{path}:10 tie_word_embeddings"),
    ])
    by_location = {p.location: p.message for p in imported.problems}
    assert by_location[f"{path}:3 hidden_size"] == 'hidden_size must be a positive integer, got "4096"'
    assert by_location[f"{path}:7 num_hidden_layers"] == "num_hidden_layers must be a positive integer, got 36.5"


def test_malformed_json_names_the_line():
    path = FIXTURES / "bad" / "malformed.json"
    (problem,) = load_hf_config(path).problems
    assert problem.code == "hf-malformed-json"
    assert problem.location == f"{path}:5"
    assert "line 5, column 1" in problem.message


def test_top_level_must_be_an_object():
    (problem,) = parse_hf_config("[1, 2]", "config.json").problems
    assert (problem.code, problem.location) == ("hf-malformed-json", "config.json:1")


def test_missing_model_type():
    (problem,) = parse_hf_config('{"hidden_size": 8}', "config.json").problems
    assert problem.code == "hf-missing-key" and "model_type" in problem.message
    assert "llama" in problem.message


def test_paths_that_do_not_hold_a_config(tmp_path):
    (missing,) = load_hf_config(tmp_path / "nope.json").problems
    assert missing.code == "hf-config-not-found"
    assert missing.location == str(tmp_path / "nope.json")
    (empty,) = load_hf_config(tmp_path).problems
    assert empty.code == "hf-config-not-found"
    assert empty.message == f"no config.json in directory {tmp_path}"
    binary = tmp_path / "config.json"
    binary.write_bytes(b'{"model_type": "llama\xff"}')
    (unreadable,) = load_hf_config(binary).problems
    assert unreadable.code == "hf-config-unreadable"


# --------------------------------------------------------------------------------------------
# The flags are Megatron's: names, dests and actions as its argument parser has them


def test_flags_match_megatrons_argument_table():
    # data/megatron_flags.tsv: Megatron-LM's parser as scripts/import_flags recorded it (d98e8a64)
    from megatron_estimator.core.resources import data_path

    with data_path("megatron_flags.tsv").open(newline="", encoding="utf-8") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    rows = {row["flag"]: row for row in csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)}
    actions = {"value": "store", "switch": "store_true", "off": "store_false"}
    for flag, (dest, kind) in SUPPLIED_FLAGS.items():
        assert flag in rows, flag
        assert rows[flag]["dest"] == dest, flag
        assert rows[flag]["action"] == actions[kind], flag


# --------------------------------------------------------------------------------------------
# megatron-core builds the mapped models: the parameter counts are the published sizes

# Argument defaults of every dest the importer can set (megatron/training/arguments.py and the
# TransformerConfig-generated flags), so the builder starts where Megatron's argparse starts.
_MEGATRON_ARG_DEFAULTS = {
    "num_layers": None, "hidden_size": None, "ffn_hidden_size": None, "num_attention_heads": None,
    "group_query_attention": False, "num_query_groups": 1, "kv_channels": None,
    "max_position_embeddings": None, "vocab_size": None, "untie_embeddings_and_output_weights": False,
    "normalization": "LayerNorm", "layernorm_epsilon": 1e-5, "swiglu": False, "add_bias_linear": True,
    "add_qkv_bias": False, "qk_layernorm": False, "attention_dropout": 0.1, "hidden_dropout": 0.1,
    "position_embedding_type": "learned_absolute", "rotary_base": 10000, "rotary_percent": 1.0,
    "use_rope_scaling": False, "rope_scaling_factor": 8.0, "rotary_seq_len_interpolation_factor": None,
    "window_size": None, "num_experts": None, "moe_ffn_hidden_size": None, "moe_router_topk": 2,
    "moe_layer_freq": 1, "moe_shared_expert_intermediate_size": None, "moe_shared_expert_gate": False,
    "moe_router_pre_softmax": False, "moe_router_score_function": "softmax",
    "moe_router_enable_expert_bias": False, "moe_router_num_groups": None, "moe_router_group_topk": None,
    "moe_router_topk_scaling_factor": None, "multi_latent_attention": False, "q_lora_rank": None,
    "kv_lora_rank": 32, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
    "rope_type": None, "apply_rope_fusion": True, "rotary_scaling_factor": 1.0, "mscale": 1.0,
    "mscale_all_dim": 0.0, "mtp_num_layers": None,
    "hybrid_layer_pattern": None, "hybrid_override_pattern": None, "mtp_hybrid_override_pattern": None,
    "mamba_num_heads": None, "mamba_head_dim": 64, "mamba_state_dim": 128,
    "mamba_num_groups": 8, "squared_relu": False, "fp32_residual_connection": False,
    "experimental_attention_variant": None, "dsa_indexer_n_heads": None, "dsa_indexer_head_dim": None,
    "dsa_indexer_topk": None,
    "softmax_type": "vanilla", "quick_geglu": False, "glu_linear_offset": 0.0,
    "activation_func_clamp_value": None, "window_attn_skip_freq": None,
    "yarn_original_max_position_embeddings": None, "yarn_beta_fast": None, "yarn_beta_slow": None,
    "yarn_correction_range_round_to_int": None, "attention_output_gate": False,
    "layernorm_zero_centered_gamma": False, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
}
# Dests only hybrid models use (HybridModel, not GPTModel; checked elsewhere).
_HYBRID_ONLY_DESTS = {"hybrid_layer_pattern", "hybrid_override_pattern", "mtp_hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "mamba_state_dim",
                      "mamba_num_groups", "squared_relu", "experimental_attention_variant", "dsa_indexer_n_heads",
                      "dsa_indexer_head_dim", "dsa_indexer_topk"}
# Dests that GPTModel takes as arguments rather than through TransformerConfig
# (megatron/training/argument_utils.py gpt_config_from_args).
_GPT_MODEL_DESTS = {
    "vocab_size", "max_position_embeddings", "untie_embeddings_and_output_weights",
    "position_embedding_type", "rotary_base", "rotary_percent", "use_rope_scaling",
    "rope_scaling_factor", "rotary_seq_len_interpolation_factor",
    # YaRN's positions (gpt_model.py reads them off the config from 0.19.0; not 0.16.1 fields).
    "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_correction_range_round_to_int",
}
_MLA_ONLY_DESTS = {
    "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "rotary_scaling_factor", "mscale", "mscale_all_dim",
}


def test_builder_knows_every_dest_the_importer_sets():
    assert {dest for dest, _ in SUPPLIED_FLAGS.values()} == set(_MEGATRON_ARG_DEFAULTS)


@pytest.fixture(scope="module")
def megatron_world(tmp_path_factory):
    """torch.distributed (gloo, world size 1) and Megatron's parallel state at TP=PP=1."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    import torch.distributed as dist
    from megatron.core import parallel_state

    started = not dist.is_initialized()
    if started:
        store = tmp_path_factory.mktemp("dist") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    initialized = not parallel_state.model_parallel_is_initialized()
    if initialized:
        parallel_state.initialize_model_parallel(1, 1)
    yield
    if initialized:
        parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


def count_with_megatron_core(raw: RawArgs, *, pad_vocab: bool) -> int:
    """Build megatron-core's GPTModel from Megatron argument values, on the meta device.

    Mirrors what Megatron's training entry point does with these arguments: validate_args
    defaults (megatron/training/arguments.py), core_transformer_config_from_args and
    gpt_config_from_args (megatron/training/argument_utils.py), and the local layer specs
    (megatron/core/models/gpt/gpt_layer_specs.py; the decoder block spec for MoE models).
    """
    import dataclasses
    import warnings
    from unittest import mock

    import torch
    import torch.nn.functional as F
    import megatron.core.transformer.multi_latent_attention as mla_module
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    args = dict(_MEGATRON_ARG_DEFAULTS)
    args.update({dest: setting.value for dest, setting in raw.settings.items()})
    hidden, heads = args["hidden_size"], args["num_attention_heads"]
    ffn = args["ffn_hidden_size"]
    if ffn is None:
        ffn = int(4 * hidden * 2 / 3 / 64) * 64 if args["swiglu"] else 4 * hidden
    moe = args["num_experts"] is not None
    kwargs = {k: v for k, v in args.items() if k not in _GPT_MODEL_DESTS and k not in _HYBRID_ONLY_DESTS}
    for dest in ("group_query_attention", "swiglu", "quick_geglu", "num_experts", "rope_type"):
        del kwargs[dest]
    kwargs.update(
        ffn_hidden_size=ffn,
        kv_channels=args["kv_channels"] if args["kv_channels"] is not None else hidden // heads,
        num_query_groups=args["num_query_groups"] if args["group_query_attention"] else None,
        num_moe_experts=args["num_experts"],
        moe_ffn_hidden_size=(args["moe_ffn_hidden_size"] or ffn) if moe else None,
        use_cpu_initialization=True, perform_initialization=False,
        # Kernel choices that need Transformer Engine or CUDA; none holds parameters.
        apply_rope_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
    )
    if args["swiglu"]:
        kwargs.update(activation_func=F.silu, gated_linear_unit=True)
    if args["quick_geglu"]:     # arguments.py: --quick-geglu is a gated unit (quick_gelu, same shapes)
        kwargs.update(gated_linear_unit=True)
    if args["multi_latent_attention"]:
        config_class = MLATransformerConfig
        if args["rope_type"] is not None:
            kwargs["rope_type"] = args["rope_type"]
    else:
        config_class = TransformerConfig
        for dest in _MLA_ONLY_DESTS:
            del kwargs[dest]
    config = config_class(**kwargs)
    if args["position_embedding_type"] == "yarn" and not args["multi_latent_attention"]:
        # GPTModel reads YaRN's settings as dynamic config attributes (Megatron-LM main's
        # megatron/training/argument_utils.py _apply_yarn_config_from_args, same defaults).
        for attr, value, default in (
                ("yarn_rotary_scaling_factor", args["rotary_scaling_factor"], 1.0),
                ("yarn_original_max_position_embeddings", args["yarn_original_max_position_embeddings"], 4096),
                ("yarn_beta_fast", args["yarn_beta_fast"], 32.0), ("yarn_beta_slow", args["yarn_beta_slow"], 1.0),
                ("yarn_mscale", args["mscale"], 1.0), ("yarn_mscale_all_dim", args["mscale_all_dim"], 0.0),
                ("yarn_correction_range_round_to_int", args["yarn_correction_range_round_to_int"], True)):
            setattr(config, attr, value if value is not None else default)
    if moe:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=config.normalization)
    else:
        spec = get_gpt_layer_local_spec(
            qk_layernorm=config.qk_layernorm,
            multi_latent_attention=config.multi_latent_attention,
            normalization=config.normalization,
        )
    if config.multi_latent_attention:
        # 0.16.1's local MLA spec pairs MLASelfAttention with a DotProductAttention that rejects
        # MLA's k/v channel arguments. Core attention holds no parameters in any backend, so a
        # parameter-free stand-in builds the same parameter set.
        class ParameterFreeCoreAttention(torch.nn.Module):
            def __init__(self, *args, **kwargs):
                super().__init__()

        for layer in getattr(spec, "layer_specs", [spec]):
            attention = layer.submodules.self_attention
            attention.submodules = dataclasses.replace(
                attention.submodules, core_attention=ModuleSpec(module=ParameterFreeCoreAttention)
            )
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if config.mtp_num_layers else None
    vocab = args["vocab_size"]
    if pad_vocab:
        vocab = math.ceil(vocab / 128) * 128  # --make-vocab-size-divisible-by 128 x TP 1
    with warnings.catch_warnings(), torch.device("meta"), \
            mock.patch("torch.cuda.current_device", return_value="meta"), \
            mock.patch.object(mla_module, "HAVE_TE", False):
        # YaRN RoPE puts its (parameter-free) tables on torch.cuda.current_device(); and without
        # Transformer Engine 0.16.1's MLA still calls isinstance(x, None) for an fp8-only tweak.
        warnings.simplefilter("ignore")
        model = GPTModel(
            config, spec, vocab_size=vocab,
            max_sequence_length=args["max_position_embeddings"],
            share_embeddings_and_output_weights=not args["untie_embeddings_and_output_weights"],
            position_embedding_type=args["position_embedding_type"],
            rotary_percent=args["rotary_percent"], rotary_base=args["rotary_base"],
            rope_scaling=args["use_rope_scaling"], rope_scaling_factor=args["rope_scaling_factor"],
            seq_len_interpolation_factor=args["rotary_seq_len_interpolation_factor"],
            mtp_block_spec=mtp_spec,
        )
    return sum(parameter.numel() for parameter in model.parameters())


def _assert_counts(imported, expected: tuple[int, int]) -> None:
    assert imported.ok, imported.problems
    unpadded, padded = expected
    assert count_with_megatron_core(imported.raw, pad_vocab=False) == unpadded
    vocab = imported.raw.value("vocab_size")
    if vocab % 128:
        assert count_with_megatron_core(imported.raw, pad_vocab=True) == padded
    else:
        assert padded == unpadded  # padding to 128 changes nothing at TP=1


_QUIET_MEGATRON = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")


@_QUIET_MEGATRON
@pytest.mark.parametrize("name", sorted(PRESET_PARAMETERS))
def test_megatron_core_builds_each_preset_at_its_published_size(megatron_world, name):
    _assert_counts(load_preset(name), PRESET_PARAMETERS[name])


@_QUIET_MEGATRON
@pytest.mark.parametrize("name", sorted(FIXTURE_PARAMETERS))
def test_megatron_core_builds_each_fixture_at_its_size(megatron_world, name):
    _assert_counts(_fixture(name), FIXTURE_PARAMETERS[name])
