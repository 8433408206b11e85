"""gpt-oss (``model_type`` gpt_oss): the HuggingFace import of gpt-oss-20b / gpt-oss-120b.

Expected counts are derived here, independently of the estimator: ``hf_checkpoint_tensors``
itemises the checkpoint's tensors (modeling_gpt_oss.py) from the config's numbers, the totals are
OpenAI's published ones, and a tiny gpt-oss-shaped model is built by megatron-core 0.16.1 on the
meta device (tests/mcore_reference.py).  The fixtures tests/fixtures/hf/gpt-oss-{20b,120b}.json
hold the published config.json values of the Hub repositories openai/gpt-oss-20b and
openai/gpt-oss-120b.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

from megatron_estimator.inputs.hf import load_hf_config, parse_hf_config

FIXTURES = Path(__file__).parent / "fixtures" / "hf"

# OpenAI's gpt-oss model card (Table 1): total parameters and active parameters per token
# (active: the non-expert weights, 4 experts per layer and the unembedding; not the embedding).
PUBLISHED = {"gpt-oss-20b": (20.91e9, 3.61e9), "gpt-oss-120b": (116.83e9, 5.13e9)}


def hf_checkpoint_tensors(config: dict) -> dict[str, int]:
    """Every tensor of the HuggingFace checkpoint (bf16 form), name -> element count."""
    h, vocab, ffn = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    heads, kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    experts = config["num_local_experts"]
    tensors = {"model.embed_tokens.weight": vocab * h, "model.norm.weight": h, "lm_head.weight": vocab * h}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = h
        tensors[p + "post_attention_layernorm.weight"] = h
        for name, out in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            tensors[p + f"self_attn.{name}.weight"] = out * h
            tensors[p + f"self_attn.{name}.bias"] = out
        tensors[p + "self_attn.o_proj.weight"] = h * heads * d
        tensors[p + "self_attn.o_proj.bias"] = h
        tensors[p + "self_attn.sinks"] = heads
        tensors[p + "mlp.router.weight"] = experts * h
        tensors[p + "mlp.router.bias"] = experts
        tensors[p + "mlp.experts.gate_up_proj"] = experts * h * 2 * ffn
        tensors[p + "mlp.experts.gate_up_proj_bias"] = experts * 2 * ffn
        tensors[p + "mlp.experts.down_proj"] = experts * ffn * h
        tensors[p + "mlp.experts.down_proj_bias"] = experts * h
    return tensors


def active_parameters(config: dict) -> int:
    tensors = hf_checkpoint_tensors(config)
    share = config["num_experts_per_tok"] / config["num_local_experts"]
    expert = sum(v for k, v in tensors.items() if ".mlp.experts." in k)
    other = sum(v for k, v in tensors.items() if ".mlp.experts." not in k and k != "model.embed_tokens.weight")
    return other + round(expert * share)


def _config(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


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


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_itemised_checkpoint_is_the_published_size(name):
    total, active = PUBLISHED[name]
    config = _config(name)
    assert round(sum(hf_checkpoint_tensors(config).values()) / 1e7) == round(total / 1e7)
    assert round(active_parameters(config) / 1e7) == round(active / 1e7)


def test_gpt_oss_120b_by_hand():
    # h 2880, 64 heads x 64, 8 KV heads, 128 experts of 2880, vocab 201088, 36 layers:
    # attention 2880x4096 + 4096 + 2 x (2880x512 + 512) + 4096x2880 + 2880 + 64 sinks = 26,550,144;
    # router 128 x 2880 + 128 = 368,768; experts 128 x (2880x5760 + 5760 + 2880x2880 + 2880)
    # = 3,186,155,520; two norms 5,760 -> 3,213,080,192 per layer;
    # embeddings 2 x 201088 x 2880 = 1,158,266,880; final norm 2,880.
    assert sum(hf_checkpoint_tensors(_config("gpt-oss-120b")).values()) == (
        36 * 3_213_080_192 + 1_158_266_880 + 2_880) == 116_829_156_672


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_import_maps_like_megatron_bridge_and_counts_the_checkpoint(name):
    imported = load_hf_config(FIXTURES / f"{name}.json")
    assert imported.ok and imported.notes == (), (imported.problems, imported.notes)
    values = _values(imported)
    config = _config(name)
    # GPTOSSBridge / Megatron-LM's examples/post_training/modelopt/conf/openai/gpt-oss-*.sh:
    assert values["softmax_type"] == "learnable" and values["quick_geglu"] is True
    assert values["glu_linear_offset"] == 1.0 and values["activation_func_clamp_value"] == 7.0
    assert values["window_size"] == (127, 0) and values["window_attn_skip_freq"] == 2
    assert values["untie_embeddings_and_output_weights"] is True and "add_bias_linear" not in values
    assert (values["num_experts"], values["moe_router_topk"], values["moe_ffn_hidden_size"]) == (
        config["num_local_experts"], 4, 2880)
    assert values["position_embedding_type"] == "yarn" and values["rotary_scaling_factor"] == 32.0
    assert values["yarn_original_max_position_embeddings"] == 4096
    assert values["yarn_correction_range_round_to_int"] is False
    # Megatron holds every checkpoint tensor (sinks as softmax_offset, the router bias, the
    # expert biases); 201088 is a multiple of 128, so the vocabulary is not padded.
    assert _estimate(imported).total_parameters == sum(hf_checkpoint_tensors(config).values())


TINY = {
    "model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
    "num_experts_per_tok": 2, "vocab_size": 1024, "max_position_embeddings": 4096, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"], "rms_norm_eps": 1e-5, "rope_theta": 150000,
    "attention_bias": True, "swiglu_limit": 7.0, "tie_word_embeddings": False,
}
# By hand: attention 64x64 + 64 + 2 x (64x32 + 32) + 64x64 + 64 + 4 sinks = 12,484; router 4x64 + 4;
# 4 experts x (64x64 + 64 + 32x64 + 64) = 25,088; two norms 128 -> 37,960 per layer;
# embeddings 2 x 1024 x 64 = 131,072; final norm 64.
TINY_TOTAL = 2 * (12_484 + 260 + 25_088 + 128) + 131_072 + 64


def test_tiny_config_by_hand_and_by_megatron_core():
    imported = parse_hf_config(json.dumps(TINY, indent=2), "config.json")
    assert imported.ok, imported.problems
    assert sum(hf_checkpoint_tensors(TINY).values()) == TINY_TOTAL
    assert _estimate(imported).total_parameters == TINY_TOTAL
    assert _values(imported)["position_embedding_type"] == "rope"   # no rope_scaling: plain RoPE
    ref = pytest.importorskip("mcore_reference")
    ok, why = ref.megatron_core_available()
    if not ok:
        pytest.skip(f"megatron-core is not installed here: {why}")
    [stage] = ref.reference_parameter_counts(dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        ffn_hidden_size=32, padded_vocab_size=1024, position_embedding_type="rope", normalization="RMSNorm",
        gated_linear_unit=True, add_bias_linear=True, softmax_type="learnable", num_experts=4,
        moe_ffn_hidden_size=32, moe_router_topk=2, moe_grouped_gemm=True,
        untie_embeddings_and_output_weights=True, window_size=(7, 0), window_attn_skip_freq=2))
    assert stage.total == TINY_TOTAL


def test_every_problem_at_its_line_at_once():
    config = {**TINY, "attention_bias": False, "layer_types": ["sliding_attention"], "swiglu_limit": -1,
              "num_local_experts": "four"}
    imported = parse_hf_config(json.dumps(config, indent=2), "config.json")
    lines = json.dumps(config, indent=2).splitlines()
    line = {k: next(i for i, t in enumerate(lines, 1) if t.strip().startswith(f'"{k}"')) for k in config}
    assert {(p.code, p.location) for p in imported.problems} == {
        ("hf-unsupported-feature", f"config.json:{line['attention_bias']} attention_bias"),
        ("hf-conflicting-keys", f"config.json:{line['layer_types']} layer_types"),
        ("hf-bad-value", f"config.json:{line['swiglu_limit']} swiglu_limit"),
        ("hf-bad-value", f"config.json:{line['num_local_experts']} num_local_experts"),
    }
    assert imported.flags == ()


def test_unknown_key_is_one_note_and_older_release_gets_plain_rope():
    config = {**_config("gpt-oss-20b"), "colour": "green"}
    imported = parse_hf_config(json.dumps(config, indent=2), "config.json")
    assert imported.ok and [(n.code, n.location.split()[-1]) for n in imported.notes] == [("hf-key-not-read", "colour")]
    # --position-embedding-type yarn and --yarn-* arrived in 0.19.0 (megatron_flag_history.tsv).
    old = parse_hf_config(json.dumps(_config("gpt-oss-20b"), indent=2), "config.json", "0.16.1")
    assert old.ok and _values(old)["position_embedding_type"] == "rope"
    assert [n.code for n in old.notes] == ["hf-approximated"] and "0.19.0" in old.notes[0].message


def test_cli_estimates_gpt_oss_20b():
    result = subprocess.run(
        [sys.executable, "-m", "megatron_estimator", "estimate", "--hf-config", str(FIXTURES / "gpt-oss-20b.json"),
         "--world-size", "8", "--gpu", "h100", "--format", "json", "--", "--seq-length", "4096",
         "--micro-batch-size", "1", "--bf16", "--expert-model-parallel-size", "8", "--use-distributed-optimizer"],
        capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["total_parameters"] == sum(hf_checkpoint_tensors(_config("gpt-oss-20b")).values())
