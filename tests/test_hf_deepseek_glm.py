"""GLM-4.5 (``glm4_moe``), Kimi-K2 (``kimi_k2``) and DeepSeek-V3.2-Exp (``deepseek_v32``): the
HuggingFace import, each checkpoint itemised tensor by tensor from its config.json, the published
sizes, and the estimator's parameter count of what Megatron builds.

The fixtures (tests/fixtures/hf/) hold the published config.json values of zai-org/GLM-4.5,
zai-org/GLM-4.5-Air, moonshotai/Kimi-K2-Instruct and deepseek-ai/DeepSeek-V3.2-Exp (the numbers as
the Hub repositories state them; GLM-4.5's and Kimi-K2's are also quoted by Megatron-Bridge's
tests/unit_tests/models/glm/test_glm45_bridge.py and kimi_vl/test_kimi_k25_vl_bridge.py).
``checkpoint_tensors`` names every tensor the checkpoint holds, following transformers'
modeling_deepseek.py / modeling_glm4_moe.py and DeepSeek-V3.2-Exp's inference/model.py (the
indexer), with MTP layers stored after the main layers as DeepSeek-V3 stores them.
megatron-core 0.16.1 builds GLM-4.5 and Kimi-K2 (tests/test_hf.py FIXTURE_PARAMETERS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_estimator.inputs.hf import SUPPORTED_MODEL_TYPES, load_hf_config, parse_hf_config

FIXTURES = Path(__file__).parent / "fixtures" / "hf"

# Published totals: (what they count, size, relative tolerance).
#   GLM-4.5 / -Air model cards: "355B total, 32B active" / "106B total, 12B active" (rounded; the
#     cards' totals match the main model, the active counts exclude the embedding and output layer).
#   Kimi-K2 technical report (arXiv 2507.20534): 1.04T total, 32.6B activated (rounded headline).
#   DeepSeek-V3.2-Exp card: 685B, as DeepSeek-V3's card: 671B main model + 14B MTP module
#     (the MTP module counts its own embedding and output-head copies).
PUBLISHED = {
    "glm-4.5.json": ("main", 355e9, 0.01),
    "glm-4.5-air.json": ("main", 106e9, 0.01),
    "kimi-k2.json": ("all", 1.04e12, 0.015),
    "deepseek-v3.2-exp.json": ("all", 685e9, 0.005),
}
PUBLISHED_ACTIVE_WITHOUT_EMBEDDINGS = {"glm-4.5.json": 32e9, "glm-4.5-air.json": 12e9}


def _config(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _mla(p: str, c: dict) -> dict[str, int]:
    h, n = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v, kv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    t = {}
    if c["q_lora_rank"]:
        t[p + "q_a_proj.weight"] = c["q_lora_rank"] * h
        t[p + "q_a_layernorm.weight"] = c["q_lora_rank"]
        t[p + "q_b_proj.weight"] = n * (nope + rope) * c["q_lora_rank"]
    else:
        t[p + "q_proj.weight"] = n * (nope + rope) * h
    t[p + "kv_a_proj_with_mqa.weight"] = (kv + rope) * h
    t[p + "kv_a_layernorm.weight"] = kv
    t[p + "kv_b_proj.weight"] = n * (nope + v) * kv
    t[p + "o_proj.weight"] = h * n * v
    if "index_n_heads" in c:  # DeepSeek-V3.2's lightning indexer (inference/model.py Indexer)
        ni, di = c["index_n_heads"], c["index_head_dim"]
        t[p + "indexer.wq_b.weight"] = ni * di * c["q_lora_rank"]
        t[p + "indexer.wk.weight"] = di * h
        t[p + "indexer.k_norm.weight"] = di
        t[p + "indexer.k_norm.bias"] = di
        t[p + "indexer.weights_proj.weight"] = ni * h
    return t


def _gqa(p: str, c: dict) -> dict[str, int]:
    """Glm4MoeAttention: q/k/v with bias (attention_bias), o_proj without, per-head q/k RMSNorm."""
    h, d = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    t = {p + "q_proj.weight": q * h, p + "k_proj.weight": kv * h, p + "v_proj.weight": kv * h,
         p + "o_proj.weight": h * q}
    if c["attention_bias"]:
        t.update({p + "q_proj.bias": q, p + "k_proj.bias": kv, p + "v_proj.bias": kv})
    if c["use_qk_norm"]:
        t.update({p + "q_norm.weight": d, p + "k_norm.weight": d})
    return t


def _layer(p: str, c: dict, moe: bool) -> dict[str, int]:
    h = c["hidden_size"]
    t = {p + "input_layernorm.weight": h, p + "post_attention_layernorm.weight": h}
    t.update((_mla if "kv_lora_rank" in c else _gqa)(p + "self_attn.", c))
    m = p + "mlp."
    if not moe:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            t[f"{m}{proj}.weight"] = c["intermediate_size"] * h
        return t
    experts, width = c["n_routed_experts"], c["moe_intermediate_size"]
    t[m + "gate.weight"] = experts * h
    t[m + "gate.e_score_correction_bias"] = experts
    for e in range(experts):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            t[f"{m}experts.{e}.{proj}.weight"] = width * h
    for proj in ("gate_proj", "up_proj", "down_proj"):
        t[f"{m}shared_experts.{proj}.weight"] = c["n_shared_experts"] * width * h
    return t


def checkpoint_tensors(c: dict) -> dict[str, int]:
    """Every tensor of the checkpoint, name -> element count, from config.json."""
    h, vocab, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    t = {"model.embed_tokens.weight": vocab * h, "model.norm.weight": h, "lm_head.weight": vocab * h}
    for i in range(layers):
        t.update(_layer(f"model.layers.{i}.", c, i >= c["first_k_dense_replace"]))
    for i in range(layers, layers + c["num_nextn_predict_layers"]):
        p = f"model.layers.{i}."
        t.update(_layer(p, c, True))
        t.update({p + "enorm.weight": h, p + "hnorm.weight": h, p + "eh_proj.weight": h * 2 * h,
                  p + "shared_head.norm.weight": h, p + "shared_head.head.weight": vocab * h,
                  p + "embed_tokens.weight": vocab * h})
    return t


def megatron_count(c: dict) -> int:
    """The checkpoint less what Megatron does not hold as parameters: the MTP layers' own copies of
    the embedding and output layer (Megatron's MTP shares the model's) and the routers'
    e_score_correction_bias (the expert_bias buffer, megatron/core/transformer/moe/router.py)."""
    layers = c["num_hidden_layers"]
    mtp = tuple(f"model.layers.{i}." for i in range(layers, layers + c["num_nextn_predict_layers"]))
    return sum(n for k, n in checkpoint_tensors(c).items()
               if not k.endswith("e_score_correction_bias")
               and not (k.startswith(mtp) and k.endswith(("embed_tokens.weight", "shared_head.head.weight"))))


# --------------------------------------------------------------------------------------------
# Sizes


# The itemisations' totals, and by hand what Megatron builds: the checkpoint less the MTP layers'
# embedding and output-head copies (2 x V x h) and one e_score_correction_bias of E per MoE layer.
#   GLM-4.5 (h 5120, V 151552, 3 dense + 89 MoE + 1 MTP, E 160 of 1536, 1 shared):
#     attention 5120x12288 + 2 x 5120x1024 + 12288x5120 + biases 14336 + q/k norms 256 = 136,329,472;
#     norms 10240; dense MLP 3x5120x12288 = 188,743,680; MoE 160x5120 + 161 x 3x5120x1536 = 3,799,285,760;
#     MTP extras 2x5120x5120 + 3x5120 = 52,444,160; embeddings 2 x 151552 x 5120 = 1,551,892,480; norm 5120:
#     3 x 325,083,392 + 90 x 3,935,625,472 + 52,444,160 + 1,551,892,480 + 5120 = 356,785,884,416 built;
#     + 1,551,892,480 MTP copies + 90 x 160 biases = 358,337,791,296 stored.
#   GLM-4.5-Air (h 4096, 1 dense + 45 MoE + 1 MTP, E 128 of 1408, no qk norm): 109,227,304,960 built
#     + 2 x 151552 x 4096 + 46 x 128 = 110,468,824,832 stored.
#   Kimi-K2 (h 7168, V 163840, 1 dense + 60 MoE, E 384 of 2048, 64 MLA heads, no MTP):
#     1,026,408,209,408 built + 60 x 384 = 1,026,408,232,448 stored.
#   DeepSeek-V3.2-Exp: DeepSeek-V3's 682,636,472,320 built (tests/test_hf.py) + an indexer of
#     1536x8192 + 7168x128 + 2x128 + 7168x64 = 13,959,424 on 61 + 1 MTP layers = 683,501,956,608;
#     + 2 x 129280 x 7168 + 59 x 256 = 685,355,329,792 stored.
CHECKPOINT_TOTALS = {
    "glm-4.5.json": 358_337_791_296,
    "glm-4.5-air.json": 110_468_824_832,
    "kimi-k2.json": 1_026_408_232_448,
    "deepseek-v3.2-exp.json": 685_355_329_792,
}
MEGATRON_TOTALS = {
    "glm-4.5.json": 356_785_884_416,
    "glm-4.5-air.json": 109_227_304_960,
    "kimi-k2.json": 1_026_408_209_408,
    "deepseek-v3.2-exp.json": 683_501_956_608,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_checkpoint_itemisation_is_the_published_size(name):
    c = _config(name)
    tensors = checkpoint_tensors(c)
    assert sum(tensors.values()) == CHECKPOINT_TOTALS[name]
    what, size, tolerance = PUBLISHED[name]
    layers = c["num_hidden_layers"]
    main = sum(n for k, n in tensors.items()
               if not any(k.startswith(f"model.layers.{i}.") for i in range(layers, layers + c["num_nextn_predict_layers"])))
    total = main if what == "main" else sum(tensors.values())
    assert abs(total - size) / size < tolerance
    if name in PUBLISHED_ACTIVE_WITHOUT_EMBEDDINGS:
        c_moe = layers - c["first_k_dense_replace"]
        idle = c_moe * (c["n_routed_experts"] - c["num_experts_per_tok"]) * 3 * c["moe_intermediate_size"] * c["hidden_size"]
        active = main - idle - 2 * c["vocab_size"] * c["hidden_size"]
        assert abs(active - PUBLISHED_ACTIVE_WITHOUT_EMBEDDINGS[name]) / PUBLISHED_ACTIVE_WITHOUT_EMBEDDINGS[name] < 0.02


def test_deepseek_v32_is_deepseek_v3_plus_the_indexer():
    c = _config("deepseek-v3.2-exp.json")
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert indexer == 13_959_424
    v3 = {k: v for k, v in c.items() if not k.startswith("index_")}
    assert megatron_count(c) - megatron_count(v3) == 62 * indexer
    assert megatron_count(v3) == 682_636_472_320     # tests/test_hf.py PRESET_PARAMETERS["deepseek-v3"]


def _estimate_parameters(name: str, extra=()) -> int:
    from megatron_estimator.api import evaluate, input_from_model

    flags = ["--seq-length", "4096", "--micro-batch-size", "1", "--bf16", "--make-vocab-size-divisible-by", "1", *extra]
    inp, problems = input_from_model(flags, hf_config=str(FIXTURES / name), environ={})
    verdict = evaluate(inp, world_size=1, environ={}, problems=problems)
    assert verdict.estimate is not None, verdict.problems
    return verdict.estimate.total_parameters


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_estimator_counts_what_megatron_builds(name):
    assert megatron_count(_config(name)) == MEGATRON_TOTALS[name]
    assert _estimate_parameters(name) == MEGATRON_TOTALS[name]


# --------------------------------------------------------------------------------------------
# Mapping


def _flags(imported) -> dict:
    return {m.flag: m.value for m in imported.mapping}


def test_glm45_flags():
    imported = load_hf_config(FIXTURES / "glm-4.5.json")
    assert imported.ok and imported.notes == ()
    flags = _flags(imported)
    assert flags["--num-layers"] == 92 and flags["--num-query-groups"] == 8 and flags["--kv-channels"] == 128
    assert flags["--add-qkv-bias"] and flags["--disable-bias-linear"] and flags["--qk-layernorm"]
    assert flags["--rotary-percent"] == 0.5 and flags["--rotary-base"] == 1_000_000
    assert flags["--moe-layer-freq"] == [0] * 3 + [1] * 89
    assert flags["--moe-shared-expert-intermediate-size"] == 1536
    assert flags["--moe-router-score-function"] == "sigmoid" and flags["--moe-router-enable-expert-bias"]
    assert flags["--moe-router-topk-scaling-factor"] == 2.5 and flags["--mtp-num-layers"] == 1
    assert "--moe-router-num-groups" not in flags  # n_group 1: no group-limited routing
    air = _flags(load_hf_config(FIXTURES / "glm-4.5-air.json"))
    assert "--qk-layernorm" not in air and air["--moe-layer-freq"] == [0] + [1] * 45


def test_kimi_k2_maps_as_deepseek_v3_does():
    kimi = _config("kimi-k2.json")
    imported = parse_hf_config(json.dumps(kimi), "config.json")
    as_v3 = parse_hf_config(json.dumps({**kimi, "model_type": "deepseek_v3"}), "config.json")
    assert imported.flags == as_v3.flags
    flags = _flags(imported)
    assert flags["--num-experts"] == 384 and flags["--num-attention-heads"] == 64
    assert flags["--moe-layer-freq"] == [0] + [1] * 60 and "--mtp-num-layers" not in flags
    assert {n.code for n in imported.notes} == {"hf-approximated", "hf-not-mapped"}  # beta_fast 1, fp8 storage


def test_deepseek_v32_is_a_hybrid_pattern_of_dsa_layers():
    imported = load_hf_config(FIXTURES / "deepseek-v3.2-exp.json")
    flags = _flags(imported)
    assert flags["--hybrid-layer-pattern"] == "D-" * 3 + "DE" * 58 + "/DE"
    assert (flags["--dsa-indexer-n-heads"], flags["--dsa-indexer-head-dim"], flags["--dsa-indexer-topk"]) == (64, 128, 2048)
    assert flags["--experimental-attention-variant"] == "dsa" and flags["--qk-layernorm"]
    assert "--num-layers" not in flags and "--moe-layer-freq" not in flags and "--mtp-num-layers" not in flags
    assert [n.code for n in imported.notes] == ["hf-not-mapped"]   # quantization_config only


def test_deepseek_v32_before_main_spells_mtp_as_its_own_pattern():
    flags = _flags(load_hf_config(FIXTURES / "deepseek-v3.2-exp.json", "0.17.0"))
    assert flags["--hybrid-layer-pattern"] == "D-" * 3 + "DE" * 58
    assert flags["--mtp-hybrid-override-pattern"] == "DE" and flags["--mtp-num-layers"] == 1


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_an_unknown_key_is_one_note(name):
    config = {**_config(name), "num_lightning_blocks": 3}
    imported = parse_hf_config(json.dumps(config, indent=2), "config.json")
    clean = parse_hf_config(json.dumps(_config(name), indent=2), "config.json")
    assert imported.ok and imported.flags == clean.flags
    extra = [n for n in imported.notes if n not in clean.notes]
    assert [(n.code, n.location.split(" ")[1]) for n in extra] == [("hf-key-not-read", "num_lightning_blocks")]


@pytest.mark.parametrize("model_type", ["glm4", "deepseek_v4", "kimi_linear"])
def test_an_unmapped_relative_is_one_error(model_type):
    imported = parse_hf_config(json.dumps({**_config("glm-4.5.json"), "model_type": model_type}), "config.json")
    (problem,) = imported.problems
    assert problem.code == "unsupported-hf-model" and repr(model_type) in problem.message
    assert imported.notes == ()
    for supported in ("glm4_moe", "kimi_k2", "deepseek_v32"):
        assert supported in SUPPORTED_MODEL_TYPES and supported in problem.message


def test_missing_indexer_keys_are_each_reported():
    config = {k: v for k, v in _config("deepseek-v3.2-exp.json").items() if k not in ("index_n_heads", "index_topk")}
    imported = parse_hf_config(json.dumps(config, indent=2), "config.json")
    assert sorted(p.message.split(" ")[0] for p in imported.problems) == ["index_n_heads", "index_topk"]
