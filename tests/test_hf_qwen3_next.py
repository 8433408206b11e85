"""Qwen3-Next (``model_type`` qwen3_next): the HuggingFace import of Qwen3-Next-80B-A3B.

Expected counts are derived here, independently of the estimator: ``hf_checkpoint_tensors``
itemises the tensors transformers' Qwen3NextForCausalLM loads (modeling_qwen3_next.py; the
checkpoint's extra ``mtp.*`` layer is not loaded) from the config's numbers; the totals are the
Qwen model card's; the gated attention and gated shared expert are built by megatron-core 0.16.1
on the meta device (tests/mcore_reference.py).  tests/fixtures/hf/qwen3-next-80b-a3b.json holds
the published config.json values of the Hub repository Qwen/Qwen3-Next-80B-A3B-Instruct.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from megatron_estimator.inputs.hf import load_hf_config, parse_hf_config

FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def hf_checkpoint_tensors(config: dict) -> dict[str, int]:
    """Every tensor Qwen3NextForCausalLM holds, name -> element count."""
    h, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    interval = config.get("full_attention_interval", 4)
    types = config.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                          for i in range(config["num_hidden_layers"])]
    tensors = {"model.embed_tokens.weight": vocab * h, "model.norm.weight": h}
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = vocab * h
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = h
        tensors[p + "post_attention_layernorm.weight"] = h
        if kind == "linear_attention":
            a = p + "linear_attn."
            tensors[a + "in_proj_qkvz.weight"] = (2 * hk * dk + 2 * hv * dv) * h
            tensors[a + "in_proj_ba.weight"] = 2 * hv * h
            tensors[a + "conv1d.weight"] = (2 * hk * dk + hv * dv) * config["linear_conv_kernel_dim"]
            tensors[a + "dt_bias"] = hv
            tensors[a + "A_log"] = hv
            tensors[a + "norm.weight"] = dv
            tensors[a + "out_proj.weight"] = h * hv * dv
        else:
            a = p + "self_attn."
            tensors[a + "q_proj.weight"] = 2 * heads * d * h        # query and output gate
            tensors[a + "k_proj.weight"] = kv * d * h
            tensors[a + "v_proj.weight"] = kv * d * h
            tensors[a + "o_proj.weight"] = h * heads * d
            tensors[a + "q_norm.weight"] = d
            tensors[a + "k_norm.weight"] = d
        m = p + "mlp."
        if config["num_experts"] and i not in config.get("mlp_only_layers", []) \
                and (i + 1) % config.get("decoder_sparse_step", 1) == 0:
            width, shared = config["moe_intermediate_size"], config["shared_expert_intermediate_size"]
            tensors[m + "gate.weight"] = config["num_experts"] * h
            for e in range(config["num_experts"]):
                for name in ("gate_proj", "up_proj", "down_proj"):
                    tensors[m + f"experts.{e}.{name}.weight"] = width * h
            for name in ("gate_proj", "up_proj", "down_proj"):
                tensors[m + f"shared_expert.{name}.weight"] = shared * h
            tensors[m + "shared_expert_gate.weight"] = h
        else:
            for name in ("gate_proj", "up_proj", "down_proj"):
                tensors[m + f"{name}.weight"] = config["intermediate_size"] * h
    return tensors


def _config() -> dict:
    return json.loads((FIXTURES / "qwen3-next-80b-a3b.json").read_text())


def _values(imported) -> dict:
    return {dest: s.value for dest, s in imported.raw.settings.items()}


def _estimate(imported, extra: str = ""):
    from megatron_estimator.api import TrainingInput, evaluate
    from megatron_estimator.inputs.argv import parse_megatron_argv

    flags, problems = parse_megatron_argv(shlex.split("--seq-length 4096 --micro-batch-size 1 --bf16 " + extra))
    assert not problems
    verdict = evaluate(TrainingInput(imported.raw.merged(flags), source="test"), world_size=1, environ={}, problems=())
    assert verdict.estimate is not None, verdict.problems
    return verdict.estimate


def test_itemised_checkpoint_is_the_model_cards_size():
    # Model card of Qwen/Qwen3-Next-80B-A3B-Instruct: 80B in total, 79B non-embedding, 3B activated,
    # 48 layers, hidden 2048, layout 12 x (3 x (Gated DeltaNet -> MoE) -> (Gated Attention -> MoE)).
    config = _config()
    tensors = hf_checkpoint_tensors(config)
    total = sum(tensors.values())
    embeddings = tensors["model.embed_tokens.weight"] + tensors["lm_head.weight"]
    assert round(total / 1e9) == 80 and round((total - embeddings) / 1e9) == 79
    experts = sum(v for k, v in tensors.items() if ".mlp.experts." in k)
    active = total - embeddings - experts + experts * 10 // 512
    assert int(active / 1e9) == 3
    # By hand: gated delta net 2048 x (2x2048 + 2x4096) + 2048 x 64 + 8192 x 4 + 32 + 32 + 128
    # + 4096 x 2048 = 33,718,464; gated attention 2048 x 8192 + 2 x 2048 x 512 + 4096 x 2048 + 2 x 256
    # = 27,263,488; MoE 512 x 2048 + 512 x 3 x 2048 x 512 + 3 x 2048 x 512 + 2048 = 1,614,809,088;
    # two norms 4096 per layer; embeddings 2 x 151936 x 2048; final norm 2048.
    assert total == (36 * (33_718_464 + 1_614_809_088 + 4096) + 12 * (27_263_488 + 1_614_809_088 + 4096)
                     + 2 * 151_936 * 2048 + 2048) == 79_674_391_296


def test_import_is_the_hybrid_pattern_and_counts_the_checkpoint():
    imported = load_hf_config(FIXTURES / "qwen3-next-80b-a3b.json")
    assert imported.ok and imported.notes == (), (imported.problems, imported.notes)
    values = _values(imported)
    assert values["hybrid_layer_pattern"] == "GEGEGE*E" * 12
    # Qwen3NextBridge's settings:
    assert values["attention_output_gate"] is True and values["qk_layernorm"] is True
    assert values["layernorm_zero_centered_gamma"] is True and values["add_bias_linear"] is False
    assert (values["linear_num_key_heads"], values["linear_num_value_heads"], values["linear_key_head_dim"],
            values["linear_value_head_dim"], values["linear_conv_kernel_dim"]) == (16, 32, 128, 128, 4)
    assert (values["num_experts"], values["moe_router_topk"], values["moe_ffn_hidden_size"]) == (512, 10, 512)
    assert values["moe_shared_expert_intermediate_size"] == 512 and values["moe_shared_expert_gate"] is True
    assert values["kv_channels"] == 256 and values["rotary_percent"] == 0.25 and values["rotary_base"] == 10_000_000
    assert "moe_router_pre_softmax" not in values          # norm_topk_prob true
    # 151936 = 1187 x 128: no padding.
    assert _estimate(imported).total_parameters == sum(hf_checkpoint_tensors(_config()).values())


TINY = {
    "model_type": "qwen3_next", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
    "mlp_only_layers": [2], "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "partial_rotary_factor": 0.5, "hidden_act": "silu", "tie_word_embeddings": False, "norm_topk_prob": False,
}
# By hand (h 64): gated delta net 64 x (2x16 + 2x32) + 64 x 8 + (2x16 + 32) x 4 + 4 + 4 + 8 + 32 x 64 = 8,976;
# gated attention 64 x 128 + 2 x 64 x 32 + 64 x 64 + 2 x 16 = 16,416; MoE 4 x 64 + 4 x 3 x 64 x 16
# + 3 x 64 x 24 + 64 = 17,216; dense MLP (layer 2) 3 x 64 x 96 = 18,432; two norms 128 per layer;
# embeddings 2 x 1024 x 64; final norm 64.
TINY_TOTAL = 2 * 8_976 + 2 * 16_416 + 3 * 17_216 + 18_432 + 4 * 128 + 2 * 1024 * 64 + 64


def test_tiny_config_by_hand():
    imported = parse_hf_config(json.dumps(TINY, indent=2), "config.json")
    assert imported.ok, imported.problems
    values = _values(imported)
    assert values["hybrid_layer_pattern"] == "GE*EG-*E"
    assert values["moe_router_pre_softmax"] is True and values["rotary_percent"] == 0.5
    assert sum(hf_checkpoint_tensors(TINY).values()) == TINY_TOTAL
    assert _estimate(imported).total_parameters == TINY_TOTAL


def test_gated_attention_and_shared_expert_gate_equal_a_megatron_core_build():
    # The '*' + 'E' part of Qwen3-Next as a GPT layer: megatron-core 0.16.1 doubles linear_qkv's query
    # part for the output gate (attention.py) and adds the shared expert's h -> 1 gate.
    ref = pytest.importorskip("mcore_reference")
    ok, why = ref.megatron_core_available()
    if not ok:
        pytest.skip(f"megatron-core is not installed here: {why}")
    [stage] = ref.reference_parameter_counts(dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        ffn_hidden_size=96, padded_vocab_size=1024, position_embedding_type="rope", normalization="RMSNorm",
        swiglu=True, add_bias_linear=False, qk_layernorm=True, attention_output_gate=True, num_experts=4,
        moe_ffn_hidden_size=16, moe_router_topk=2, moe_grouped_gemm=True, moe_shared_expert_intermediate_size=24,
        moe_shared_expert_gate=True, untie_embeddings_and_output_weights=True))
    # attention (16,416) + its norm, MoE (17,216) + its norm, per layer; embeddings; final norm.
    assert stage.total == 2 * (16_416 + 17_216 + 128) + 2 * 1024 * 64 + 64


def test_every_problem_at_its_line_at_once():
    config = {**TINY, "attention_bias": True, "layer_types": ["linear_attention", "sliding_attention"],
              "mlp_only_layers": "none", "linear_num_value_heads": 0}
    imported = parse_hf_config(json.dumps(config, indent=2), "config.json")
    lines = json.dumps(config, indent=2).splitlines()
    line = {k: next(i for i, t in enumerate(lines, 1) if t.strip().startswith(f'"{k}"')) for k in config}
    assert {(p.code, p.location) for p in imported.problems} == {
        ("hf-unsupported-feature", f"config.json:{line['attention_bias']} attention_bias"),
        ("hf-bad-value", f"config.json:{line['layer_types']} layer_types"),
        ("hf-bad-value", f"config.json:{line['mlp_only_layers']} mlp_only_layers"),
        ("hf-bad-value", f"config.json:{line['linear_num_value_heads']} linear_num_value_heads"),
    }


def test_full_attention_interval_and_unknown_keys():
    config = {k: v for k, v in TINY.items() if k != "layer_types"}
    config.update(full_attention_interval=2, colour="green")
    imported = parse_hf_config(json.dumps(config, indent=2), "config.json")
    assert imported.ok and _values(imported)["hybrid_layer_pattern"] == "GE*EG-*E"
    assert [(n.code, n.location.split()[-1]) for n in imported.notes] == [("hf-key-not-read", "colour")]


def test_release_without_gated_attention_is_refused():
    imported = load_hf_config(FIXTURES / "qwen3-next-80b-a3b.json", "0.15.3")
    assert [p.code for p in imported.problems] == ["hf-unsupported-feature"]
    assert "0.16.1" in imported.problems[0].message
